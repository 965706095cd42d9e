"""WER reward for LLM speech recognition with GRPO (catalog id ``grpo_asr``), on text transcripts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._utils import answer_text, column, completion_text, normalize_text

__all__ = ["WERReward", "wer", "wer_reward", "word_errors"]


def word_errors(hypothesis: Sequence[str], reference: Sequence[str]) -> int:
    """Levenshtein distance over words: substitutions + deletions + insertions (unit costs)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp_word in enumerate(hypothesis, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
        previous = current
    return previous[-1]


def wer(hypothesis: str, reference: str, *, normalize: bool = True) -> float:
    """Word error rate (S + D + I) / N_ref; an empty reference gives 0 for an empty hypothesis, else 1 per word
    (reported as the number of inserted words, i.e. ≥ 1)."""
    norm = normalize_text if normalize else (lambda s: " ".join(s.split()))
    hyp, ref = norm(hypothesis).split(), norm(reference).split()
    if not ref:
        return float(len(hyp))
    return word_errors(hyp, ref) / len(ref)


class WERReward:
    """``r = max(0, 1 − WER(hypothesis, reference))`` (catalog ``grpo_asr``: "GRPO for LLM-based ASR", the paper
    designs "simple rule based reward functions" on WER; its exact rules were not available, this is the catalog's
    ``wer_reward``).

    The hypothesis is the ``<answer>`` content when present, else the whole completion. Text is lower-cased,
    punctuation removed and whitespace collapsed before counting (``normalize=True``; our choice, standard WER
    scoring). Identical transcripts → 1; one substitution in four words → 0.75; an empty completion against a
    non-empty reference → 0; a missing reference (``None``) → ``None``.

    Dataset column: ``reference`` (alias ``solution``): the gold transcript. Text-only, so a transcript-correction
    task (noisy ASR hypothesis in the prompt, corrected transcript as the completion) exercises it without audio.
    """

    __name__ = "wer_reward"

    def __init__(self, *, normalize: bool = True, answer_tag: str | None = "answer"):
        self.normalize = normalize
        self.answer_tag = answer_tag

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float | None]:
        texts = [completion_text(c) for c in (completions or [])]
        refs = column(kwargs, "reference", len(texts), "solution")
        out: list[float | None] = []
        for text, ref in zip(texts, refs, strict=True):
            if ref is None:
                out.append(None)
                continue
            out.append(max(0.0, 1.0 - wer(answer_text(text, self.answer_tag), str(ref), normalize=self.normalize)))
        return out


wer_reward = WERReward()
