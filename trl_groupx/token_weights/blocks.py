"""Text blocks of a completion, one per reward function, and the block id of every completion token.

Shared by the block-scoped token variants (`blockwise_adv`, `rs_grpo`). A variant that requires `"token_blocks"`
owns one config field ending in `_block_tags`: the tag names, aligned with the reward functions (tag `k` names
the block scored by `reward_funcs[k]`). The trainer fills `TokenContext.token_blocks` with `token_block_ids`.

Blocks are consecutive segments of the completion text, in tag order:

- block 0 starts at the beginning of the completion; block `k > 0` starts where block `k − 1` ended;
- block `k` ends right after the first `</tag_k>` found from its start; without one (a truncated completion or an
  unclosed tag), at the first `<tag_{k+1}>` found from its start (the next block opens), and for the last block,
  or when the next tag is not there either, at the end of the completion (the later blocks are then empty).

Choice: untagged text *before* a closing tag belongs to that block (the reasoning written before `<answer>` is what
produced the answer, so it is credited with the answer's reward), and a completion without any tag is all block 0.
Text after the last block's closing tag (e.g. the EOS token) is outside every block: id `-1`, like padding.

A token's block is the block holding the first character of its text (`tokenizer.decode([id])`, special tokens
kept, no clean-up); a token of empty text belongs to the block holding its position. A token straddling a boundary
therefore belongs to the earlier block. Decoding token by token keeps each token's character offsets exact for
byte-level BPE (ASCII tags are never split into partial characters) and loses at most leading spaces for
SentencePiece tokenizers, which no tag contains.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import torch

# A tag name as it appears between the angle brackets: no brackets, slashes, spaces or attributes.
_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")
OUTSIDE = -1


def check_block_tags(flag: str, tags: Any) -> None:
    """`tags` is a non-empty list of distinct tag names (`"answer"`, not `"<answer>"`); else a `ValueError` naming
    `flag` and the fix."""
    if isinstance(tags, str) or not isinstance(tags, Sequence) or len(tags) == 0:
        raise ValueError(f"{flag} must be a non-empty list of tag names, one per reward function (e.g. "
                         f"['answer', 'confidence']), got {tags!r}.")
    for tag in tags:
        if not isinstance(tag, str) or not _TAG_NAME.match(tag):
            raise ValueError(
                f"{flag}: {tag!r} is not a tag name; give the bare name of each tag (e.g. 'answer' for "
                "<answer>...</answer>): a letter or '_' then letters, digits, '_', '.', ':' or '-'."
            )
    if len(set(tags)) != len(tags):
        raise ValueError(f"{flag}={list(tags)!r} repeats a tag; each reward function needs its own block.")


def block_tags_field(params: Sequence[str]) -> str:
    """The config field (among a variant's `params`) that holds its block tags."""
    fields = [p for p in params if p.endswith("_block_tags")]
    if len(fields) != 1:
        raise ValueError(f"a variant that requires 'token_blocks' owns exactly one '*_block_tags' field, got {fields}.")
    return fields[0]


def block_char_spans(text: str, tags: Sequence[str]) -> list[tuple[float, float]]:
    """`[start, end)` character span of each block of `text` (see the module docstring); empty blocks are
    `(inf, inf)`; the end of an unclosed block is `inf`."""
    spans: list[tuple[float, float]] = []
    start: float = 0
    for k, tag in enumerate(tags):
        if start == math.inf:
            spans.append((math.inf, math.inf))
            continue
        begin = int(start)
        close = text.find(f"</{tag}>", begin)
        if close >= 0:
            end: float = close + len(tag) + 3
        else:
            opening = text.find(f"<{tags[k + 1]}>", begin) if k + 1 < len(tags) else -1
            end = opening if opening >= 0 else math.inf
        spans.append((start, end))
        start = end
    return spans


def _pieces(tokenizer: Any, ids: list[int]) -> dict[int, str]:
    unique = sorted(set(ids))
    texts = tokenizer.batch_decode([[i] for i in unique], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    return dict(zip(unique, texts, strict=True))


def token_block_ids(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, tokenizer: Any, tags: Sequence[str]
) -> torch.Tensor:
    """`(N, T)` long: the block (index into `tags`) of each completion token, `-1` outside every block and on
    padding. Only the real tokens (`completion_mask == 1`) of a row are read, in order."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a multimodal processor wraps its tokenizer
    blocks = torch.full(completion_ids.shape, OUTSIDE, dtype=torch.long)
    real = completion_mask.bool().cpu()
    ids = completion_ids.cpu()
    pieces = _pieces(tokenizer, ids[real].tolist())
    for row in range(ids.shape[0]):
        positions = real[row].nonzero().flatten().tolist()
        texts = [pieces[i] for i in ids[row, positions].tolist()]
        lengths = torch.tensor([len(piece) for piece in texts], dtype=torch.float64)
        starts = lengths.cumsum(0) - lengths  # character offset of each token's text
        row_blocks = torch.full((len(positions),), OUTSIDE, dtype=torch.long)
        for k, (lo, hi) in enumerate(block_char_spans("".join(texts), tags)):  # disjoint spans
            row_blocks[(starts >= lo) & (starts < hi)] = k
        blocks[row, positions] = row_blocks
    return blocks.to(completion_ids.device)


def check_block_inputs(variant_id: str, ctx: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The `(N, K)` rewards and `(N, T)` block ids of `ctx`, checked: present, aligned, finite or NaN."""
    rewards, blocks = ctx.rewards_per_func, ctx.token_blocks
    if rewards is None or blocks is None:
        raise ValueError(f"token_weighting={variant_id!r} needs rewards_per_func and token_blocks in the TokenContext.")
    if rewards.dim() != 2 or rewards.shape[0] != blocks.shape[0] or blocks.shape != ctx.completion_mask.shape:
        raise ValueError(f"token_weighting={variant_id!r}: rewards_per_func {tuple(rewards.shape)}, token_blocks "
                         f"{tuple(blocks.shape)} and completion_mask {tuple(ctx.completion_mask.shape)} do not align.")
    if int(blocks.max()) >= rewards.shape[1]:
        raise ValueError(f"token_weighting={variant_id!r}: a token is in block {int(blocks.max())}, but there are "
                         f"only {rewards.shape[1]} reward functions.")
    if torch.isinf(rewards).any():
        raise ValueError(f"token_weighting={variant_id!r}: a reward is ±inf; reward functions must return finite "
                         "numbers (or NaN/None for 'unscored', which gets advantage 0).")
    return rewards.float(), blocks


def spread_block_advantages(block_adv: torch.Tensor, blocks: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(N, T)`: each token gets its block's advantage `block_adv[i, blocks[i, t]]`; 0 outside every block and on
    padding."""
    inside = (blocks >= 0) & mask.bool()
    picked = block_adv.to(mask.device).gather(1, blocks.clamp(min=0).to(mask.device))
    return torch.where(inside, picked, torch.zeros_like(picked))
