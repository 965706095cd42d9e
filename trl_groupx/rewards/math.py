"""Math accuracy via math-verify: TRL's own ``trl.rewards.accuracy_reward``, wrapped for plain-text completions
and missing solutions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._utils import as_conversational, column

__all__ = ["answer_accuracy_reward", "math_accuracy_reward", "math_correct", "math_equal"]


def math_correct(texts: Sequence[str], solutions: Sequence[Any]) -> list[float | None]:
    """1.0 / 0.0 per text by math-verify (``trl.rewards.accuracy_reward``: the first ``\\boxed{}`` or LaTeX answer
    of the text against the parsed gold), ``None`` where the gold is missing or unparseable."""
    from trl.rewards import accuracy_reward

    out: list[float | None] = [None] * len(texts)
    rows = [i for i, sol in enumerate(solutions) if sol is not None and str(sol).strip() != ""]
    if rows:
        scores = accuracy_reward(as_conversational([texts[i] for i in rows]), [str(solutions[i]) for i in rows])
        for i, score in zip(rows, scores, strict=True):
            out[i] = score
    return out


def math_equal(answers: Sequence[str], solutions: Sequence[Any]) -> list[float | None]:
    """1.0 / 0.0 per extracted answer string by math-verify with its default extraction (LaTeX *and* plain
    expressions, so a bare ``4`` inside ``<answer>`` tags counts, which TRL's anchored ``accuracy_reward`` does not
    extract); ``None`` where the gold is missing or unparseable; an empty answer is 0."""
    import threading

    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    out: list[float | None] = []
    for answer, sol in zip(answers, solutions, strict=True):
        if sol is None or str(sol).strip() == "":
            out.append(None)
            continue
        gold = parse(str(sol), parsing_timeout=10 if main else None)
        if not gold:
            out.append(None)
            continue
        pred = parse(answer, parsing_timeout=10 if main else None) if answer.strip() else []
        out.append(float(bool(pred) and verify(gold, pred, timeout_seconds=5 if main else None)))
    return out


def math_accuracy_reward(
    prompts: list[Any] | None = None,
    completions: list[Any] | None = None,
    completion_ids: list[list[int]] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Math accuracy: ``r = 1`` if math-verify finds the completion's answer equal to the ``solution`` column, else 0.

    This is TRL's ``trl.rewards.accuracy_reward`` (math-verify ``parse``/``verify``, ``\\boxed{}`` first, gold
    unparseable → ``None``) unchanged, made to accept plain-text completions as well as conversational ones, and a
    missing ``solution`` column or ``None`` cell (→ ``None``: TRL leaves the row out of the group statistics).

    Dataset column: ``solution`` (gold answer, LaTeX or plain).
    """
    from ._utils import completion_text

    completions = completions or []
    texts = [completion_text(c) for c in completions]
    return math_correct(texts, column(kwargs, "solution", len(texts)))


def answer_accuracy_reward(
    prompts: list[Any] | None = None,
    completions: list[Any] | None = None,
    completion_ids: list[list[int]] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Outcome accuracy of the ``<answer>…</answer>`` content (the last pair; the whole completion when there is
    none): ``r = 1`` if math-verify (default extraction: LaTeX and plain expressions, :func:`math_equal`) finds it
    equal to the ``solution`` column, else 0; ``None`` where the solution is missing. Unlike
    :func:`math_accuracy_reward` it never reads a number out of the reasoning.
    """
    from ._utils import answer_text, completion_text

    texts = [completion_text(c) for c in (completions or [])]
    return math_equal([answer_text(t) for t in texts], column(kwargs, "solution", len(texts)))
