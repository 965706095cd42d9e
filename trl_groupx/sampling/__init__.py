"""Sampling stage: what is generated and what is kept.

Contract (see `trl_groupx.contracts`): a rollout filter is `fn(batch: RolloutBatch, *, <config fields>) -> keep
(N,) bool` over the global generation batch. The trainer keeps the batch's shape (groups and per-process slices
are fixed by TRL's sampler) and neutralises dropped rollouts: completion mask 0 and advantage 0, so they count
in no normaliser; `num_items_in_batch` is recomputed. Advantages are computed after the filter, over the kept
rollouts only (dropped rollouts enter the advantage stage as NaN rewards).

Variants of this stage register here with `stage="sampling"`; none ships in this module yet, the seam is
exercised by `tests/test_trainer_seams.py`.
"""

from __future__ import annotations

import torch

from ..contracts import RolloutBatch


def apply_keep_mask(rewards: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Rewards with dropped rollouts set to NaN, so every advantage estimator leaves them out of its statistics."""
    if keep.dtype != torch.bool or keep.shape != rewards.shape[:1]:
        raise ValueError(f"A rollout filter must return a bool tensor of shape ({rewards.shape[0]},).")
    dropped = ~keep
    return rewards.masked_fill(dropped.view(-1, *([1] * (rewards.dim() - 1))), float("nan"))


def keep_all(batch: RolloutBatch, variant_id: str) -> torch.Tensor:
    """The `(N,)` all-True keep mask of a variant whose filter keeps every rollout (its work is elsewhere: prompt
    selection, rewritten rows), after refusing infinite rewards."""
    if torch.isinf(batch.rewards).any():
        raise ValueError(f"rollout_filter={variant_id!r} got an infinite reward; reward functions must return finite "
                         "values or NaN.")
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)


__all__ = ["RolloutBatch", "apply_keep_mask", "keep_all"]

from . import (  # noqa: F401  (registers the variants)
    consistency_grpo,  # noqa: F401  (registers the variant)
    d3s,
    dapo_dynamic_sampling,  # noqa: F401  (registers the variant)
    ebpo_curriculum,  # noqa: F401  (registers the variant and its prompt selection)
    eframe,  # noqa: F401  (registers the variant)
    gcpo_ref,  # noqa: F401  (registers the variant)
    gfpo,
    igrpo,  # noqa: F401  (registers the variant)
    logit_avg,  # noqa: F401  (registers the variant)
    lspo,  # noqa: F401  (registers the variant)
    n_grpo,  # noqa: F401  (registers the variant)
    pilot_commit,  # noqa: F401  (registers the variant and its prompt selection)
    rc_grpo,  # noqa: F401  (registers the variant)
    repo,  # noqa: F401  (registers the variant)
    s2l_po,  # noqa: F401  (registers the variant)
    sage,  # noqa: F401  (registers the variant)
    sgpo,  # noqa: F401  (registers the variant and its prompt selection)
    soup,  # noqa: F401  (registers the variant)
    spo_prioritized,  # noqa: F401  (registers the variant and its prompt selection)
    v0_value,  # noqa: F401  (registers the variant and its prompt selection)
    vade,  # noqa: F401  (registers the variant and its prompt selection)
    zero_variance_filter,
)
