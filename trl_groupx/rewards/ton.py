"""TON (think-or-not): thought-dropout SFT data transform and a format reward that accepts an empty thought."""

from __future__ import annotations

import random
import re
from typing import Any

from .format import TagFormatReward

__all__ = ["EMPTY_THOUGHT", "drop_thought", "thought_dropout", "ton_format_reward"]

#: The empty thought TON writes into dropped SFT targets.
EMPTY_THOUGHT = "<think>\n\n</think>"
_THINK = re.compile(r"<think>.*?</think>", flags=re.DOTALL)


def drop_thought(text: str) -> str:
    """Every ``<think>…</think>`` block of ``text`` replaced by the empty thought ``<think>\\n\\n</think>``."""
    return _THINK.sub(lambda _: EMPTY_THOUGHT, text)


def thought_dropout(dataset: Any, p: float = 0.5, *, seed: int = 0, column: str = "completion") -> Any:
    """TON's thought dropout ("Think or Not? Selective Reasoning via Reinforcement Learning for Vision-Language
    Models", arXiv:2505.16854; catalog id ``ton``) for the SFT cold start: each example's target (``column``) has
    its reasoning replaced by the empty thought with probability ``p``.

    Official code: kokolerk/TON@22102c281b004cd1c286c368c578ced5b37c4572:src/eval/aitz_evaluate/sft_grpo_data.py:
    convert_format_to_sft (mode ``two_mode``, l.38-43): with probability 0.5 the answer is written as
    ``<think>\\n\\n</think><action>…</action>`` instead of ``<think>{thought}</think><action>…</action>``.
    Here the thought is dropped from an existing target (string, or the ``content`` of each assistant message of a
    conversational target); p = 0 is the identity, p = 1 empties every ``<think>`` block. Deterministic given
    ``seed`` (example i uses ``random.Random(seed * 1_000_003 + i)``). Works on a ``datasets.Dataset`` (via
    ``map(with_indices=True)``) or a list of dicts.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"thought_dropout: p must be in [0, 1], got {p}.")

    def transform(example: dict, idx: int) -> dict:
        if random.Random(seed * 1_000_003 + idx).random() >= p:
            return dict(example)
        target = example[column]
        if isinstance(target, str):
            new = drop_thought(target)
        else:
            new = [
                {**m, "content": drop_thought(m["content"])}
                if m.get("role") == "assistant" and isinstance(m.get("content"), str) else m
                for m in target
            ]
        return {**example, column: new}

    if hasattr(dataset, "map") and hasattr(dataset, "column_names"):
        return dataset.map(transform, with_indices=True)
    return [transform(example, i) for i, example in enumerate(dataset)]


class _TONFormatReward(TagFormatReward):
    """TON's format reward: ``r = 1`` if the completion is ``<think>…</think>`` then ``<answer>…</answer>`` (only
    whitespace around and between), where the thought may be empty (``<think>\\n\\n</think>`` or ``<think></think>``),
    else 0. Official code: kokolerk/TON@22102c281b004cd1c286c368c578ced5b37c4572:src/r1-v/src/open_r1/grpo.py:
    format_reward l.96-101 (``re.fullmatch(r"<think>.*?</think>\\s*<answer>.*?</answer>", content, re.DOTALL)``).
    Our difference: each tag must occur exactly once (the official lazy pattern also accepts a nested second
    ``<think>`` inside the answer) and leading/trailing whitespace is allowed; the answer may be empty as in the
    official pattern. Use with an outcome reward (e.g. ``math_accuracy_reward`` or ``label_match_reward``): the
    paper's GRPO stage is stock GRPO on outcome + format.
    """

    def __init__(self) -> None:
        super().__init__(("think", "answer"), allow_empty=True, name="ton_format_reward")


ton_format_reward = _TONFormatReward()
