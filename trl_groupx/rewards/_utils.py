"""Shared helpers of the reward functions: completion text, dataset columns, tagged sections.

TRL 1.16 calls a reward function as ``f(prompts=..., completions=..., completion_ids=..., **columns,
trainer_state=..., log_extra=..., log_metric=...)``. ``completions`` is a list of strings (plain-text datasets) or
a list of message lists (conversational datasets; the completion is the assistant message(s) generated). Every
reward here accepts both, and reads dataset columns from ``kwargs`` with :func:`column`, so a missing column or a
``None`` cell gives ``None`` for that row (TRL turns ``None`` into NaN: the row is left out of the statistics)
instead of crashing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["answer_text", "as_conversational", "column", "completion_text", "normalize_text", "tag_content"]


def completion_text(completion: Any) -> str:
    """The generated text of one completion: a plain string, or the concatenated ``content`` of a message list
    (TRL's conversational format: ``[{"role": "assistant", "content": "..."}]``). ``None`` gives ``""``."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content", "")
        return content if isinstance(content, str) else _content_parts(content)
    if isinstance(completion, Sequence):
        return "".join(completion_text(message) for message in completion)
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


def _content_parts(content: Any) -> str:
    # multimodal content: [{"type": "text", "text": "..."}, {"type": "image"}, ...]
    if content is None:
        return ""
    return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")


def as_conversational(completions: Sequence[Any]) -> list[list[dict[str, str]]]:
    """Completions in the one-message conversational form that TRL's own ``trl.rewards`` functions index
    (``completion[0]["content"]``), whatever form they came in."""
    return [[{"role": "assistant", "content": completion_text(c)}] for c in completions]


def column(kwargs: dict[str, Any], name: str, n: int, *aliases: str) -> list[Any]:
    """Dataset column ``name`` (or the first present alias) from the reward kwargs, as a list of length ``n``;
    ``[None] * n`` when the dataset has no such column. A wrong length is a clear error."""
    for key in (name, *aliases):
        if key in kwargs and kwargs[key] is not None:
            values = list(kwargs[key])
            if len(values) != n:
                raise ValueError(f"column {key!r} has {len(values)} values for {n} completions")
            return values
    return [None] * n


def tag_content(text: str, tag: str, *, last: bool = False) -> str | None:
    """Text between ``<tag>`` and ``</tag>`` (first pair, or the last with ``last=True``), stripped; ``None`` when
    the pair is absent."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    if not matches:
        return None
    return (matches[-1] if last else matches[0]).strip()


def answer_text(text: str, tag: str | None = "answer") -> str:
    """The final answer of a completion: the last ``<tag>…</tag>`` content when present, else the whole text
    (stripped). ``tag=None`` always gives the whole text."""
    if tag is not None:
        inner = tag_content(text, tag, last=True)
        if inner is not None:
            return inner
    return text.strip()


_PUNCT = re.compile(r"[^\w\s']", flags=re.UNICODE)


def normalize_text(text: str) -> str:
    """Lower-case, punctuation (except apostrophes) replaced by spaces, whitespace collapsed."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())
