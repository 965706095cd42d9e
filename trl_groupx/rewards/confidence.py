"""Verbalised-confidence calibration reward: the Brier score of ``<confidence>…</confidence>`` against correctness,
the second objective of the math-with-confidence task (``recipes/blockwise_adv.yaml``)."""

from __future__ import annotations

import re
from typing import Any

from ._utils import answer_text, column, completion_text, tag_content
from .math import math_equal

__all__ = ["confidence_brier_reward", "parse_confidence"]

_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(%?)\s*$")


def parse_confidence(text: str) -> float | None:
    """The stated probability of the last ``<confidence>…</confidence>``: a number in ``[0, 1]`` or a percentage
    (``"80%"`` → 0.8); ``None`` when the tag is missing, not a number, or out of range."""
    inner = tag_content(text, "confidence", last=True)
    match = _NUMBER.match(inner) if inner is not None else None
    if match is None:
        return None
    value = float(match.group(1)) / (100.0 if match.group(2) else 1.0)
    return value if 0.0 <= value <= 1.0 else None


def confidence_brier_reward(
    prompts: list[Any] | None = None,
    completions: list[Any] | None = None,
    completion_ids: list[list[int]] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Calibration of the stated confidence ``q`` (:func:`parse_confidence`) in the ``<answer>`` being right:

        r = 1 − (q − c)²,   c = 1 if the answer equals the gold (``answer_accuracy_reward``'s check) else 0

    in ``[0, 1]`` (the negated Brier score shifted by 1, as RLCR's calibration term); a missing or unparseable
    confidence gets 0 (the worst score); ``None`` where the gold is missing. Gold column: ``solution`` (math
    datasets) or ``answer`` (the toy arithmetic task).
    """
    texts = [completion_text(c) for c in (completions or [])]
    golds = column(kwargs, "solution", len(texts), "answer")
    correct = math_equal([answer_text(t) for t in texts], golds)
    scores: list[float | None] = []
    for text, c in zip(texts, correct, strict=True):
        if c is None:
            scores.append(None)
            continue
        q = parse_confidence(text)
        scores.append(0.0 if q is None else 1.0 - (q - c) ** 2)
    return scores


#: Scores the toy arithmetic task too (its ``answer`` column): `trl-groupx grpo --toy` keeps it as a second reward.
confidence_brier_reward.toy_task = True
