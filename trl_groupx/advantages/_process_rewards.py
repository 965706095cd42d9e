"""Shared helpers of the advantage variants that read an outcome-verifier column and a process-reward (PRM / judge)
column of the per-reward-function matrix (`papo`, `verigate`); no variant lives here."""

from __future__ import annotations

import torch

from ..contracts import grouped


def check_reward_indices(config, variant_id: str) -> None:
    """`validate(config)` part shared by the variants: the two column indices are non-negative integers and distinct.
    (The number of reward functions is a trainer argument, not a config field: it is checked at the first step,
    see :func:`outcome_and_process_columns`.)"""
    outcome = getattr(config, f"{variant_id}_outcome_reward_index")
    process = getattr(config, f"{variant_id}_process_reward_index")
    flags = (f"{variant_id}_outcome_reward_index", f"{variant_id}_process_reward_index")
    for flag, value in zip(flags, (outcome, process), strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{flag} must be a non-negative integer (the position of that reward function in the trainer's "
                f"reward_funcs), got {value!r}."
            )
    if outcome == process:
        raise ValueError(
            f"{variant_id}_outcome_reward_index and {variant_id}_process_reward_index are both {outcome}: the outcome "
            "verifier and the process reward model must be two different entries of reward_funcs."
        )


def outcome_and_process_columns(
    rewards: torch.Tensor, outcome_index: int, process_index: int, variant_id: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `(N,)` outcome and process columns of the `(N, K)` per-function matrix.

    A `(N,)` vector (a pure-function call without a process column) is read as the outcome column with every process
    score unscored (NaN). A matrix with fewer than two columns, or an index out of range, raises a `ValueError` naming
    the flags: pass the verifier and the PRM as two of the trainer's `reward_funcs`.
    """
    if outcome_index == process_index:
        raise ValueError(f"{variant_id}_outcome_reward_index and {variant_id}_process_reward_index must differ.")
    if rewards.dim() == 1:
        return rewards, torch.full_like(rewards, float("nan"))
    k = rewards.shape[1]
    if k < 2:
        raise ValueError(
            f"advantage_estimator={variant_id!r} needs at least two reward functions (the outcome verifier and the "
            f"process reward model / judge), got {k}: pass both in the trainer's reward_funcs and point "
            f"{variant_id}_outcome_reward_index / {variant_id}_process_reward_index at them."
        )
    for flag, value in ((f"{variant_id}_outcome_reward_index", outcome_index),
                        (f"{variant_id}_process_reward_index", process_index)):
        if not 0 <= value < k:
            raise ValueError(f"{flag}={value} is out of range for {k} reward functions (valid: 0..{k - 1}).")
    return rewards[:, outcome_index], rewards[:, process_index]


def masked_group_zscore(values: torch.Tensor, member: torch.Tensor, eps: float, min_std: float = 0.0) -> torch.Tensor:
    """`(B, G)` values, `(B, G)` bool membership → `(B, G)` z-scores `(x − μ) / (σ + eps)` over the members of each
    row (unbiased σ), 0 for non-members and for rows with fewer than two members or `σ ≤ min_std`."""
    count = member.sum(dim=1, keepdim=True)
    x = torch.where(member, values, torch.zeros_like(values))
    mean = x.sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq = torch.where(member, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=1, keepdim=True)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    active = (count >= 2) & (std > min_std)
    z = (x - mean) / (std + eps)
    return torch.where(member & active, z, torch.zeros_like(z))


def grouped_columns(outcome: torch.Tensor, process: torch.Tensor, group_size: int):
    """`(N,)`, `(N,)` → `(B, G)`, `(B, G)` group views."""
    return grouped(outcome, group_size), grouped(process, group_size)
