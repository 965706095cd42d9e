"""DVAO: per-group, variance-adaptive combination of per-reward advantages (arXiv:2605.25604; no public code)."""

from __future__ import annotations

import torch

from ..contracts import grouped, nan_std
from ..registry import register
from ._checks import reject_infinite
from .mo_grpo import per_function_group_zscores, reward_weight_vector

DVAO_EPS = 1e-4  # TRL's GRPO std epsilon, for the per-reward z-scores


def _validate(config) -> None:
    if not config.dvao_variance_power > 0:
        raise ValueError(
            f"dvao_variance_power must be > 0 (2.0 weights by variance, 1.0 by standard deviation), got "
            f"{config.dvao_variance_power}."
        )


@register(
    "dvao",
    name="DVAO (Dynamic Variance-adaptive Advantage Optimization)",
    paper="DVAO: Dynamic Variance-adaptive Advantage Optimization for Multi-reward Reinforcement Learning, "
    "arXiv:2605.25604",
    official_code=None,
    stage="advantages",
    flags={"advantage_estimator": "dvao", "dvao_variance_power": 2.0},
    params=("dvao_variance_power",),
    requires=("rewards_per_func",),
    validate=_validate,
)
def dvao_advantages(
    rewards: torch.Tensor, group_size: int, *, dvao_variance_power: float = 2.0, reward_weights=None
) -> torch.Tensor:
    r"""DVAO: combine per-reward group advantages with weights set, per group, by each reward's within-group spread.

    For group `g` and reward function `k` (scored members only): `σ_gk` the unbiased std and
    `z_ik = (r_ik − μ_gk) / (σ_gk + 1e-4)` the GRPO advantage of reward `k`. Then

    `w_gk = c_k σ_gk^p / Σ_j c_j σ_gj^p`  and  `A_i = Σ_k w_gk z_ik`,

    with `p = dvao_variance_power` (2: variance) and `c_k` TRL's `reward_weights` as the target preference
    (default all 1, "equal target weights"). An objective that is constant in a group (no learning signal there)
    gets weight 0 in that group; an objective that spreads the group's responses gets more weight. Because the
    weights are convex, `|A_i| ≤ max_k |z_ik| ≤ (n−1)/sqrt(n)` for any reward scales (the paper's bounded
    advantage magnitude); with `K = 1` it is GRPO's group z-score.

    Shapes: `rewards (N, K)` (a `(N,)` vector is read as `K = 1`) → `(N,)`.

    Citation: arXiv:2605.25604 (abstract, §1-2 read); there is no public code (official-code.md: "per-group
    variance-based weights; summaries disagree on σ vs 1/σ weighting"). The method section (the exact weight
    formula and its regularisation analysis) could not be read here, so the formula above is **our reading of the
    abstract**, not a transcription: "dynamically adjusts combination weights based on the empirical reward
    variance of each objective within a rollout group, effectively up-weighting objectives with a stronger
    learning signal while suppressing noisy ones". Open choices, with what we chose: weights grow with the spread
    (the abstract and the catalog's check "reward constant in a group → weight 0"; an inverse-variance reading
    would give a constant reward infinite weight); `p` is exposed (2 = variance, the abstract's word; 1 = std);
    weights normalised to sum to 1 per group (bounded magnitude); the per-reward advantage is GRPO's z-score
    (unbiased std + 1e-4, TRL's convention); `reward_weights` multiply before normalisation.

    NaN entries are left out of their function's statistics and contribute 0; a function with fewer than two
    scored members in a group gets weight 0 there; a group where every function is constant gets 0; a rollout no
    function scored gets 0.

    Args:
        rewards (`torch.Tensor`): `(N, K)` per-function rewards (NaN where unscored; ±inf raises).
        group_size (`int`): `G`.
        dvao_variance_power (`float`): `p > 0` in `w ∝ σ^p`.
        reward_weights (`list[float]` or `None`): TRL's `reward_weights`, the target weights `c_k ≥ 0`.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "dvao")
    matrix = rewards.unsqueeze(1) if rewards.dim() == 1 else rewards
    targets = reward_weight_vector(reward_weights, matrix.shape[1], matrix, "dvao")
    if (targets < 0).any():
        raise ValueError("advantage_estimator='dvao' needs non-negative reward_weights (target weights c_k).")
    z = grouped(per_function_group_zscores(matrix, group_size, DVAO_EPS).nan_to_num(0.0), group_size)  # (B, G, K)
    by_group = grouped(matrix, group_size)
    std = nan_std(by_group, dim=1) if group_size > 1 else torch.full_like(by_group[:, 0], float("nan"))  # (B, K)
    spread = targets * std.nan_to_num(0.0).pow(dvao_variance_power)  # (B, K)
    total = spread.sum(dim=1, keepdim=True)
    safe_total = total.clamp(min=torch.finfo(spread.dtype).tiny)
    weights = torch.where(total > 0, spread / safe_total, torch.zeros_like(spread))
    return (z * weights.unsqueeze(1)).sum(dim=2).reshape(-1)
