"""Group-normalised advantages: GRPO's (TRL's own computation) and GDPO's per-reward decoupled normalisation.

Both are TRL built-ins, registered as native presets; these functions are our pure references of TRL's numbers.
"""

from __future__ import annotations

import torch

from ..contracts import grouped, nan_group_mean, nan_group_std, nan_std
from ..registry import register

# TRL 1.16 adds this to the std before dividing (grpo_trainer.py, `_generate_and_score_completions`).
TRL_STD_EPS = 1e-4


@register(
    "grpo_deepseekmath",
    name="GRPO (DeepSeekMath)",
    paper="DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models, arXiv:2402.03300",
    official_code=None,
    stage="advantages",
    flags={"loss_type": "grpo", "scale_rewards": "group", "beta": 0.04},
    native=True,
    bibtex=(
        "@article{shao2024deepseekmath,\n  title={DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open "
        "Language Models},\n  author={Shao, Zhihong and others},\n  journal={arXiv preprint arXiv:2402.03300},\n"
        "  year={2024}\n}"
    ),
)
def group_normalized_advantages(
    rewards: torch.Tensor, group_size: int, *, scale_rewards: str = "group", eps: float = TRL_STD_EPS
) -> torch.Tensor:
    """GRPO's group-relative advantage, exactly as TRL computes it.

    `A_i = (r_i - mean_g(r)) / (std + eps)` with `std` the unbiased std of the group (`scale_rewards="group"`), of
    the whole batch (`"batch"`), or no division (`"none"`, Dr. GRPO). NaN rewards are left out of mean and std and
    get advantage 0.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups contiguous.
        group_size (`int`): `G`.
        scale_rewards (`str`): `"group"`, `"batch"` or `"none"`.
        eps (`float`): added to the std (TRL: 1e-4).

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    centred = rewards - nan_group_mean(rewards, group_size)
    if scale_rewards == "group":
        std = nan_group_std(rewards, group_size) if group_size > 1 else torch.zeros_like(rewards)
        centred = centred / (std + eps)
    elif scale_rewards == "batch":
        std = nan_std(rewards) if rewards.numel() > 1 else torch.zeros(())
        centred = centred / (std + eps)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    return torch.nan_to_num(centred, nan=0.0)


@register(
    "gdpo_multireward",
    name="GDPO (Group reward-Decoupled Normalization Policy Optimization)",
    paper="GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL, arXiv:2601.05242",
    official_code=None,
    stage="advantages",
    flags={"multi_objective_aggregation": "normalize_then_sum"},
    native=True,
)
def decoupled_normalized_advantages(
    rewards: torch.Tensor, group_size: int, *, reward_weights: torch.Tensor | None = None, eps: float = TRL_STD_EPS
) -> torch.Tensor:
    """GDPO: normalise each reward function within its group, sum, then normalise over the batch.

    `z_ik = (r_ik - mean_g(r_k)) / (std_g(r_k) + eps)`, `s_i = Σ_k w_k z_ik`,
    `A_i = (s_i - mean(s)) / (std(s) + eps)`, as TRL's `multi_objective_aggregation="normalize_then_sum"`.

    Args:
        rewards (`torch.Tensor`): `(N, K)` per-function rewards (NaN where a function returned None).
        group_size (`int`): `G`.
        reward_weights (`torch.Tensor`, *optional*): `(K,)` weights `w_k` (default all ones).

    Returns:
        `torch.Tensor`: `(N,)` advantages; rows that no function scored get 0.
    """
    if rewards.dim() != 2:
        raise ValueError(f"GDPO needs per-function rewards of shape (N, K); got {tuple(rewards.shape)}.")
    weights = torch.ones(rewards.shape[1]) if reward_weights is None else reward_weights
    by_group = grouped(rewards, group_size)  # (N/G, G, K)
    mean = torch.nanmean(by_group, dim=1, keepdim=True)
    std = nan_std(by_group, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    z = ((by_group - mean) / (std + eps)).reshape_as(rewards)
    summed = (z * weights.to(z).unsqueeze(0)).nansum(dim=1)
    summed[torch.isnan(rewards).all(dim=1)] = torch.nan
    std_all = nan_std(summed) if summed.numel() > 1 else torch.zeros(())
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (std_all + eps), nan=0.0)
