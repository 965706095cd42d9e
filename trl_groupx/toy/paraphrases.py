"""Paraphrase groups for the toy arithmetic task (`rollout_filter="consistency_grpo"` on the tiny model).

Each problem `"a<op>b="` gets semantically equivalent phrasings in a list column, each a fresh conversation in the
format of the row's `prompt`: the original, the operands swapped where the operator commutes (else the operands in
parentheses), a question, and a spaced form. Every phrasing has the same answer, so the row's `answer` column
(and `arithmetic_reward`) still applies to every rollout of the group.
"""

from __future__ import annotations

import re
from typing import Any

_PROBLEM = re.compile(r"^(\d+)([+\-*])(\d+)=$")
_COMMUTES = {"+", "*"}


def arithmetic_paraphrases(problem: str) -> list[str]:
    """The four phrasings of `problem` (`"a<op>b="`), the original first, e.g. `"2+3="` →
    `["2+3=", "3+2=", "What is 2+3?", "2 + 3 ="]`."""
    match = _PROBLEM.match(problem)
    if match is None:
        raise ValueError(f"not a toy arithmetic problem 'a<op>b=': {problem!r}")
    a, op, b = match.groups()
    swapped = f"{b}{op}{a}=" if op in _COMMUTES else f"({a}){op}({b})="
    return [problem, swapped, f"What is {a}{op}{b}?", f"{a} {op} {b} ="]


def _as_prompt(text: str, like: Any) -> Any:
    """`text` in the format of the prompt `like`: a string, or a one-message user conversation."""
    return text if isinstance(like, str) else [{"role": "user", "content": text}]


def add_arithmetic_paraphrases(dataset: Any, column: str = "paraphrases") -> Any:
    """`dataset` (`trl_groupx.toy.arithmetic_dataset`) with `column` holding each row's phrasings in the format of
    its prompt (for a conversational prompt, the last user message's content is the problem)."""
    def add(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row["prompt"]
        problem = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        return {column: [_as_prompt(p, prompt) for p in arithmetic_paraphrases(problem)]}

    return dataset.map(add)
