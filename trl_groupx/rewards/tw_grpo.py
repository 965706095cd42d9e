"""TW-GRPO soft multi-choice partial-credit reward."""

from __future__ import annotations

import re
from typing import Any

from ._utils import answer_text, column, completion_text

__all__ = ["multi_choice_partial_reward", "parse_options"]


def parse_options(text: Any) -> set[str]:
    """Option letters from ``"A, C"`` / ``"A,C"`` / ``["A", "C"]``: comma-separated, spaces dropped, upper-cased;
    empty items dropped."""
    if text is None:
        return set()
    items = text if isinstance(text, (list, tuple, set)) else str(text).split(",")
    return {re.sub(r"\s+", "", str(item)).upper() for item in items if re.sub(r"\s+", "", str(item))}


def multi_choice_partial_reward(prompts=None, completions=None, completion_ids=None,
                                **kwargs: Any) -> list[float | None]:
    """TW-GRPO soft multi-choice reward ("Reinforcing Video Reasoning with Focused Thinking", arXiv:2505.24718;
    catalog id ``tw_grpo``):

        r = |S_pred| / |S_gold|   if S_pred ⊆ S_gold and S_pred ≠ ∅
          = 0                     otherwise (any wrong option, or no option)

    S are the sets of chosen option letters (comma-separated inside ``<answer>`` when present, else the whole
    completion). Official code: longmalongma/TW-GRPO@aa529ffca7ae408e4f3df7ba71cb0dc58544c6b7:
    src/open_r1/grpo.py:accuracy_reward l.92-155 (string branch l.117-140: sets split on ",", spaces removed,
    subset → len(pred)/len(gold)). Differences, our choice: letters are upper-cased; the official code first tries
    a math-verify equality (for letters it only matters for exact matches, which the set rule already scores 1);
    an empty answer scores 0 (the official code's set ``{""}`` is never a subset either). So 2 of 3 correct options
    → 2/3; one wrong option → 0. ``None`` gold → ``None``.

    Dataset column: ``solution``: the correct options, e.g. ``"A,C"`` or ``["A", "C"]``.
    """
    texts = [completion_text(c) for c in (completions or [])]
    golds = column(kwargs, "solution", len(texts))
    out: list[float | None] = []
    for text, gold in zip(texts, golds, strict=True):
        gold_set = parse_options(answer_text(gold) if isinstance(gold, str) else gold)
        if gold is None or not gold_set:
            out.append(None)
            continue
        pred = parse_options(answer_text(text))
        out.append(len(pred) / len(gold_set) if pred and pred <= gold_set else 0.0)
    return out
