"""Format rewards: tagged sections present in order (the R1 ``<think>…</think><answer>…</answer>`` layout and
its variants)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ._utils import completion_text

__all__ = ["TagFormatReward", "tag_format_reward", "think_answer_format_reward", "think_format_reward"]


class TagFormatReward:
    """``r = 1`` if the completion is exactly the given tagged sections in order (whitespace between and around
    them allowed, nothing else), each tag used once; else 0.

    With ``allow_empty=False`` every section must hold non-whitespace text; with ``allow_empty=True`` an empty
    section (e.g. the empty thought ``<think>\\n\\n</think>`` of TON) passes. A callable class, so it stays
    picklable for TRL's async rollout worker (as TRL's own parametrised rewards).
    """

    def __init__(self, tags: Sequence[str] = ("think", "answer"), *, allow_empty: bool = False,
                 name: str | None = None):
        if not tags:
            raise ValueError("TagFormatReward: give at least one tag.")
        self.tags = tuple(tags)
        self.allow_empty = allow_empty
        self._pattern = re.compile(
            r"\s*" + r"\s*".join(rf"<{re.escape(t)}>(.*?)</{re.escape(t)}>" for t in self.tags) + r"\s*",
            flags=re.DOTALL,
        )
        self.__name__ = name or "tag_format_reward"

    def check(self, text: str) -> bool:
        if any(text.count(f"<{t}>") != 1 or text.count(f"</{t}>") != 1 for t in self.tags):
            return False
        match = self._pattern.fullmatch(text)
        if match is None:
            return False
        return self.allow_empty or all(group.strip() for group in match.groups())

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float]:
        return [1.0 if self.check(completion_text(c)) else 0.0 for c in (completions or [])]


#: ``<think>…</think><answer>…</answer>``, both non-empty.
think_answer_format_reward = TagFormatReward(("think", "answer"), name="think_answer_format_reward")
tag_format_reward = think_answer_format_reward


def think_format_reward(prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float]:
    """TRL's ``trl.rewards.think_format_reward`` (completion starts with ``<think>…</think>``; 1 / 0), made to
    accept plain-text completions."""
    from trl.rewards import think_format_reward as trl_think_format_reward

    from ._utils import as_conversational

    return trl_think_format_reward(as_conversational(completions or []))
