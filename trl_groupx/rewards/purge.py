"""PURGE forbidden-concept reward (unlearning as a verifiable task)."""

from __future__ import annotations

import re
from typing import Any

from ._utils import column, completion_text

__all__ = ["ForbiddenConceptReward", "forbidden_concept_reward", "mentions"]


def _concepts(cell: Any) -> list[str]:
    if cell is None:
        return []
    if isinstance(cell, str):
        cell = cell.split("|")  # "Harry Potter|Hogwarts|Dumbledore"
    return [c.strip() for c in cell if isinstance(c, str) and c.strip()]


def mentions(text: str, concepts: list[str]) -> list[str]:
    """The concepts mentioned in ``text``: case-insensitive, whole words (``\\b`` boundaries where the concept
    starts/ends with a word character), internal whitespace matching any whitespace run."""
    found = []
    for concept in concepts:
        body = r"\s+".join(re.escape(part) for part in concept.split())
        left = r"\b" if re.match(r"\w", concept) else ""
        right = r"\b" if re.search(r"\w$", concept) else ""
        if re.search(left + body + right, text, flags=re.IGNORECASE | re.UNICODE):
            found.append(concept)
    return found


class ForbiddenConceptReward:
    """PURGE (Policy Unlearning through Relative Group Erasure, arXiv:2601.20568): plain GRPO whose intrinsic reward
    penalises any mention of a forbidden concept.

        r = clean_reward (1.0)          if no forbidden concept appears in the completion
          = violation_reward (0.0)      otherwise

    Matching is case-insensitive on whole words (a concept ``Potter`` does not fire on ``Potterton``). The paper's
    concept list per target is its top-50 extracted entities (official-code notes; no public code); the list
    comes from the dataset. Choices: binary 1/0 (the catalog allows −1 or 0; under GRPO's group z-score the two
    give the same advantages); no partial credit for the number of mentions. A row whose concept list is missing
    (``None``) gets ``None`` (no target: left out of the statistics); an empty completion is clean (1.0).

    Dataset column: ``forbidden_concepts``: a list of strings, or one string with ``|`` separators.
    """

    __name__ = "forbidden_concept_reward"

    def __init__(self, *, clean_reward: float = 1.0, violation_reward: float = 0.0):
        if not violation_reward < clean_reward:
            raise ValueError("violation_reward must be below clean_reward.")
        self.clean_reward = clean_reward
        self.violation_reward = violation_reward

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float | None]:
        texts = [completion_text(c) for c in (completions or [])]
        cells = column(kwargs, "forbidden_concepts", len(texts))
        out: list[float | None] = []
        for text, cell in zip(texts, cells, strict=True):
            if cell is None:
                out.append(None)
                continue
            out.append(self.violation_reward if mentions(text, _concepts(cell)) else self.clean_reward)
        return out


forbidden_concept_reward = ForbiddenConceptReward()
