"""Pass@k training advantage: only each group's best rollout is credited (verl's `grpo_passk`, arXiv:2503.19595)."""

from __future__ import annotations

import math

import torch

from ..contracts import grouped, nan_std
from ..registry import register
from ._checks import reject_infinite

# verl's epsilon for the std division (TRL's GRPO uses 1e-4).
PASSK_STD_EPS = 1e-6


def _validate(config) -> None:
    if not isinstance(config.grpo_passk_norm_by_std, bool):
        raise ValueError(f"grpo_passk_norm_by_std must be True or False, got {config.grpo_passk_norm_by_std!r}.")


@register(
    "grpo_passk",
    name="GRPO pass@k (best-of-group advantage)",
    paper="Optimizing Language Models for Inference Time Objectives using Reinforcement Learning, arXiv:2503.19595 "
    "(the pass@k estimator as implemented in verl)",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="advantages",
    flags={"advantage_estimator": "grpo_passk", "grpo_passk_norm_by_std": True},
    params=("grpo_passk_norm_by_std",),
    validate=_validate,
)
def grpo_passk_advantages(
    rewards: torch.Tensor, group_size: int, *, grpo_passk_norm_by_std: bool = True
) -> torch.Tensor:
    """Pass@k advantage: the group's best rollout gets `r_max − r_second`, every other rollout 0.

    `A_{i*} = (r_(1) − r_(2)) / (std_g(r) + 1e-6)` for `i* = argmax_i r_i` (`r_(1) ≥ r_(2)` the two largest rewards,
    std unbiased; no division when `grpo_passk_norm_by_std=False`), `A_i = 0` otherwise. Only a rollout that beats
    all its siblings is reinforced, which optimises the best-of-G (pass@k) outcome rather than the mean. With
    ties at the top the credit is 0 (so which tied rollout is "best" never matters); an all-equal group gets 0.

    Reference: verl (peer framework)
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py,
    `compute_grpo_passk_outcome_advantage` (l.471-530): `torch.topk(rewards, 2)`, `advantage / (std + epsilon)` with
    `epsilon=1e-6` and `norm_adv_by_std_in_grpo` (default True), which `grpo_passk_norm_by_std` mirrors. We keep
    verl's 1e-6 (not TRL's 1e-4) so the numbers match verl's.

    Choices: verl raises for groups of fewer than two rollouts; here a group with fewer than two *scored*
    rollouts (`G = 1`, or NaN siblings) gets 0. NaN rewards (unscored) are left out of the max, the runner-up and the
    std, and get 0; ±inf rewards raise a `ValueError`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.
        grpo_passk_norm_by_std (`bool`): divide by the group std (+1e-6).

    Returns:
        `torch.Tensor`: `(N,)` advantages, non-zero at most once per group.
    """
    reject_infinite(rewards, "grpo_passk")
    by_group = grouped(rewards, group_size)
    scored = ~torch.isnan(by_group)
    masked = torch.where(scored, by_group, torch.full_like(by_group, -math.inf))
    if group_size < 2:
        return torch.zeros_like(rewards)
    top, top_idx = torch.topk(masked, 2, dim=1)  # (N/G, 2)
    gap = top[:, 0] - top[:, 1]
    if grpo_passk_norm_by_std:
        gap = gap / (nan_std(by_group, dim=1) + PASSK_STD_EPS)
    gap = torch.where(scored.sum(dim=1) >= 2, gap, torch.zeros_like(gap))  # also clears inf/NaN of thin groups
    adv = torch.zeros_like(by_group)
    adv.scatter_(1, top_idx[:, :1], gap.unsqueeze(1))
    return adv.reshape(rewards.shape)
