"""TimeMaster composite reward: structured sections (reasoning, classification, extension) + label accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._utils import column, completion_text, normalize_text, tag_content
from .format import TagFormatReward

__all__ = ["StructuredSectionsReward", "structured_sections_reward"]


class StructuredSectionsReward:
    """TimeMaster (arXiv:2506.13705; catalog id ``timemaster``): a three-part structured output — reasoning,
    classification, domain-specific extension — trained with a composite reward of format adherence, prediction
    accuracy and open-ended insight quality.

        r = w_format · format + w_accuracy · accuracy
        format   = 1 if the completion is exactly <think>…</think> <class>…</class> <extension>…</extension>
                   (each present once, in order, non-empty), else 0
        accuracy = 1 if the normalised <class> content equals the normalised ``label`` column, else 0

    The insight-quality term needs a judge model and is left out. The tags ``<think>``, ``<class>``,
    ``<extension>`` and a binary format reward requiring non-empty sections follow a secondary summary of the
    paper (the paper text and code were not readable here); weights 1 / 1 are our choice; tags are a parameter. Accuracy is scored whenever a ``<class>`` section
    exists, even if the rest of the format is off (the terms are independent). ``None`` label → accuracy 0 and a
    format-only reward (our choice, so a mixed dataset still trains the format). The paper's model reads plotted
    series (images); on text models the series goes in the prompt as numbers.

    Dataset column: ``label``: the gold class.
    """

    __name__ = "structured_sections_reward"

    def __init__(self, tags: Sequence[str] = ("think", "class", "extension"), *, w_format: float = 1.0,
                 w_accuracy: float = 1.0):
        if len(tags) != 3:
            raise ValueError("tags: give the reasoning, classification and extension tag names.")
        self.tags = tuple(tags)
        self.w_format, self.w_accuracy = w_format, w_accuracy
        self._format = TagFormatReward(self.tags)

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float]:
        texts = [completion_text(c) for c in (completions or [])]
        labels = column(kwargs, "label", len(texts), "solution")
        out = []
        for text, label in zip(texts, labels, strict=True):
            fmt = 1.0 if self._format.check(text) else 0.0
            predicted = tag_content(text, self.tags[1])
            acc = float(label is not None and predicted is not None and predicted != ""
                        and normalize_text(predicted) == normalize_text(str(label)))
            out.append(self.w_format * fmt + self.w_accuracy * acc)
        return out


structured_sections_reward = StructuredSectionsReward()
