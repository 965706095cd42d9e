"""MO-GRPO: each reward function z-scored within its group, then summed (arXiv:2509.22047)."""

from __future__ import annotations

import torch

from ..contracts import grouped, nan_std
from ..registry import register
from ._checks import reject_infinite

# The GRPO std epsilon of TRL 1.16 (the paper's GRPO formula has none; a constant reward then gives 0/eps = 0).
MO_GRPO_EPS = 1e-4


def per_function_group_zscores(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    """`(N, K)` → `(N, K)` within-group z-scores of each reward function (unbiased std, `+eps`), NaN where the
    entry is NaN; 0 for groups with fewer than two scored entries of that function."""
    by_group = grouped(rewards, group_size)  # (B, G, K)
    mean = torch.nanmean(by_group, dim=1, keepdim=True)
    std = nan_std(by_group, dim=1, keepdim=True) if group_size > 1 else torch.full_like(mean, float("nan"))
    z = (by_group - mean) / (std.nan_to_num(0.0) + eps)
    # fewer than two scored entries: no within-group contrast → 0 (keep NaN where the entry itself is unscored)
    z = torch.where(torch.isnan(std) & ~torch.isnan(by_group), torch.zeros_like(z), z)
    return z.reshape_as(rewards)


def reward_weight_vector(reward_weights, k: int, like: torch.Tensor, variant_id: str) -> torch.Tensor:
    """TRL's `reward_weights` (list or tensor or None) as a `(K,)` tensor; ones when None."""
    if reward_weights is None:
        return torch.ones(k, dtype=like.dtype, device=like.device)
    weights = torch.as_tensor(reward_weights, dtype=like.dtype, device=like.device).flatten()
    if weights.numel() != k:
        raise ValueError(
            f"advantage_estimator={variant_id!r}: reward_weights has {weights.numel()} entries for {k} reward "
            "functions."
        )
    return weights


@register(
    "mo_grpo",
    name="MO-GRPO (Multi-Objective GRPO, variance-normalised reward aggregation)",
    paper="MO-GRPO: Mitigating Reward Hacking of Group Relative Policy Optimization on Multi-Objective Problems, "
    "arXiv:2509.22047",
    official_code=None,
    stage="advantages",
    requires=("rewards_per_func",),
)
def mo_grpo_advantages(rewards: torch.Tensor, group_size: int, *, reward_weights=None) -> torch.Tensor:
    r"""MO-GRPO: normalise each reward function by its within-group spread, then sum.

    `A_i = Σ_k w_k · (r_ik − mean_g(r_k)) / (std_g(r_k) + ε)` over the `K` reward functions, with `mean_g`, `std_g`
    the mean and unbiased std of function `k` over the scored members of rollout `i`'s group and `w_k` TRL's
    `reward_weights` (default all 1, the paper). Every function then contributes a term of unit within-group
    scale whatever its raw scale, so a high-variance reward cannot dominate (the paper's reward-hacking fix) and
    rescaling one reward function by any positive factor leaves the advantages (up to ε) unchanged.

    Shapes: `rewards (N, K)` per-function matrix (the trainer passes it because of `requires=("rewards_per_func",)`;
    a `(N,)` vector is read as `K = 1`, which is GRPO's group z-score) → `(N,)`.

    Citation: arXiv:2509.22047, Eq. 5 (no public code; official-code.md: "per-objective group z-score, summed").
    Relation to TRL: `multi_objective_aggregation="normalize_then_sum"` (GDPO) computes the same sum and then
    standardises it again over the whole batch; MO-GRPO has no second normalisation.

    Choices the paper leaves open: ε = 1e-4 and the unbiased std, as TRL's GRPO (so `K = 1` reproduces TRL's
    advantages exactly); a function that is constant in a group contributes 0 there; NaN entries (a function
    that returned None) are left out of that function's statistics and contribute 0 to the sum; a rollout no
    function scored gets 0; `w_k` multiplies the z-score (applying it to the raw reward would cancel out).

    Args:
        rewards (`torch.Tensor`): `(N, K)` per-function rewards (NaN where unscored; ±inf raises).
        group_size (`int`): `G`.
        reward_weights (`list[float]` or `None`): TRL's `reward_weights`.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "mo_grpo")
    matrix = rewards.unsqueeze(1) if rewards.dim() == 1 else rewards
    z = per_function_group_zscores(matrix, group_size, MO_GRPO_EPS)
    weights = reward_weight_vector(reward_weights, matrix.shape[1], matrix, "mo_grpo")
    return (z * weights).nansum(dim=1)  # unscored entries add 0; all-NaN rows give 0
