"""MathForge DGPO: difficulty-balanced group advantages (DGAE) and difficulty-aware question weighting (DQW)."""

from __future__ import annotations

import torch

from ..contracts import grouped, nan_std
from ..registry import register
from ._checks import reject_infinite

# Official code: `advantages_extent + 1e-4` (the same constant TRL adds to the std).
MATHFORGE_DGPO_EPS = 1e-4
# Official code: a group is "zero-std" when `torch.isclose(std, 0)`, i.e. |std| <= 1e-8 (default atol).
_ZERO_STD_ATOL = 1e-8


def _validate(config) -> None:
    if not config.mathforge_dgpo_dqw_temperature > 0:
        raise ValueError(
            "mathforge_dgpo_dqw_temperature must be > 0 (the paper uses 2.0), got "
            f"{config.mathforge_dgpo_dqw_temperature}."
        )


@register(
    "mathforge_dgpo",
    name="MathForge DGPO (Difficulty-Aware Group Policy Optimization)",
    paper="Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware GRPO and Multi-Aspect Question "
    "Reformulation, arXiv:2601.20614",
    official_code="AMAP-ML/MathForge@83edda024759f052a4a715eb2c2e553fb9da25ca:trl-0.20.0/trl/trainer/grpo_trainer.py",
    stage="advantages",
    flags={"advantage_estimator": "mathforge_dgpo", "mathforge_dgpo_dqw": True, "mathforge_dgpo_dqw_temperature": 2.0},
    params=("mathforge_dgpo_dqw", "mathforge_dgpo_dqw_temperature"),
    validate=_validate,
)
def mathforge_dgpo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    mathforge_dgpo_dqw: bool = True,
    mathforge_dgpo_dqw_temperature: float = 2.0,
) -> torch.Tensor:
    r"""DGPO advantages: mean-absolute-deviation normalisation (DGAE) times a softmax question weight (DQW).

    For group `q` with scored rewards `r_1..r_n` (`n = G` without NaN), mean `μ_q`:

    - DGAE: `Â_i = n · (r_i − μ_q) / (Σ_j |r_j − μ_q| + 1e-4)`, i.e. `(r_i − μ_q) / MAD_q`. Every informative
      group then has the same total update magnitude `Σ_i |Â_i| ≈ n`, whatever its accuracy (GRPO's std
      normalisation gives `2G·sqrt(p(1−p))`, smallest for hard and easy questions).
    - DQW (`mathforge_dgpo_dqw=True`): over the `M` informative groups of the batch (reward std not ≈ 0),
      `λ_q = M · softmax_q(−acc_q / T)` with `acc_q = μ_q` and `T = mathforge_dgpo_dqw_temperature` (paper: 2.0);
      the weights average 1 and favour harder questions. Zero-std groups keep weight 1 (their `Â` is 0 anyway).
    - `A_i = λ_q · Â_i`.

    Shapes: `rewards (N,)`, `N = (N/G)·G` contiguous groups → `(N,)`.

    Citation: arXiv:2601.20614 (ICLR 2026); official code AMAP-ML/MathForge@83edda024759f052a4a715eb2c2e553fb9da25ca:
    trl-0.20.0/trl/trainer/grpo_trainer.py, `GRPOTrainer._generate_and_score_completions`, l.1680-1745 (flags
    `enable_dgpo`, `enable_dgpo_dqw`, `dgpo_dqw_temp=2.0` in scripts_mathforge/*/run_dgpo.sh).

    Differences from the official code, and choices:

    - Accuracy for DQW: the official code uses the group mean of the *first* reward function
      (`rewards_per_func[:, 0]`) and maps groups with accuracy exactly 0 to 1 before the softmax; we use the group
      mean of the (weighted) reward this stage receives and no remapping. With the paper's single 0/1 accuracy
      reward the two agree: an all-wrong group has zero std and is not weighted at all.
    - NaN (unscored) rewards are left out: `n` and `μ_q` count scored members only (the official code has no
      NaN rewards and uses `G`); an all-NaN group gets 0 and does not enter the softmax.
    - Token rebalancing in the official code is a loss normaliser, not an advantage, and needs completion lengths
      that this stage does not see: (a) `global_balancing_ratio` turns TRL 0.20's per-process `bnpo` token mean
      into a global token mean — TRL 1.16's `loss_type="dapo"` already normalises by the global token count, which
      is what the recipe uses; (b) `zero_mask_ratio` rescales all advantages by (all tokens / tokens of informative
      groups), i.e. normalises by the tokens of informative groups only. (b) is not reproduced here; it would be a
      sampling-stage filter dropping zero-std groups (then `num_items_in_batch` counts only informative tokens).
    - The paper's `loss_type="dgpo"` is documented in the official config but absent from its code (bnpo is used).

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards (NaN where unscored; ±inf raises).
        group_size (`int`): `G`.
        mathforge_dgpo_dqw (`bool`): apply the question weighting (DQW); `False` gives DGAE alone.
        mathforge_dgpo_dqw_temperature (`float`): DQW temperature `T > 0`.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages; 0 for NaN rewards, zero-spread groups and `G = 1`.
    """
    reject_infinite(rewards, "mathforge_dgpo")
    if rewards.dim() != 1:
        raise ValueError(
            f"advantage_estimator='mathforge_dgpo' needs rewards of shape (N,); got {tuple(rewards.shape)}."
        )
    by_group = grouped(rewards, group_size)  # (B, G)
    scored = (~torch.isnan(by_group)).sum(dim=1, keepdim=True).to(rewards.dtype)  # n per group
    mean = torch.nanmean(by_group, dim=1, keepdim=True)  # NaN for an all-NaN group
    centred = by_group - mean  # NaN where unscored
    extent = centred.abs().nansum(dim=1, keepdim=True)  # Σ_j |r_j − μ|
    advantages = scored * centred / (extent + MATHFORGE_DGPO_EPS)

    if mathforge_dgpo_dqw:
        std = nan_std(by_group, dim=1) if group_size > 1 else torch.full_like(mean.squeeze(1), float("nan"))
        informative = std > _ZERO_STD_ATOL  # NaN (fewer than two scored) → False
        if informative.any():
            logits = (-mean.squeeze(1) / mathforge_dgpo_dqw_temperature).masked_fill(~informative, float("-inf"))
            weights = informative.sum().to(rewards.dtype) * torch.softmax(logits, dim=0)
            weights = torch.where(informative, weights, torch.ones_like(weights))
            advantages = advantages * weights.unsqueeze(1)
    return torch.nan_to_num(advantages.reshape_as(rewards), nan=0.0)
