"""OPO: on-policy RL with the length-weighted optimal reward baseline (arXiv:2505.23585), as verl's `opo` advantage
estimator (peer-framework extra)."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite


@register(
    "opo",
    name="OPO (On-Policy RL with Optimal reward baseline)",
    paper="On-Policy RL with Optimal Reward Baseline, arXiv:2505.23585",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="advantages",
    requires=("completion_lengths",),
)
def opo_advantages(rewards: torch.Tensor, group_size: int, *, completion_lengths: torch.Tensor) -> torch.Tensor:
    """OPO advantage: reward minus the group's length-weighted mean reward (the variance-optimal baseline when the
    squared gradient norm of a completion is taken proportional to its length).

        b_g = Σ_{i∈g} L_i r_i / Σ_{i∈g} L_i,        A_i = r_i − b_g

    with `L_i` the number of completion tokens of rollout `i`. No std division.

    Reference: verl (peer framework; not in TRL's GRPO trainer)
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py,
    `compute_opo_outcome_advantage` (l.639-690): `L = response_mask.sum(-1)`, per prompt index
    `bsl = (L * score).sum() / L.sum()` when the group has more than one rollout, `bsl = 0` when it has one
    (l.677-682), then `score − bsl`.

    Choices: a group of one (`group_size == 1`) gets baseline 0, so `A = r` (verl l.677-678). Rollouts with NaN
    reward (unscored) or length 0 (empty completion) are left out of both sums (an empty completion already has
    weight 0 in verl; NaN is ours, by the stage contract); a NaN-reward rollout gets advantage 0; an empty one keeps
    `r − b` (it has no tokens, so it moves nothing). A group of ≥ 2 with no scored non-empty rollout has no baseline
    and gets 0 everywhere (verl would divide 0 by 0). ±inf rewards raise a `ValueError`; negative lengths too.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.
        completion_lengths (`torch.Tensor`): `(N,)` completion token counts (supplied by the trainer).

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "opo")
    if completion_lengths.numel() != rewards.numel():
        raise ValueError(f"advantage_estimator='opo': completion_lengths {tuple(completion_lengths.shape)} does not "
                         f"match rewards {tuple(rewards.shape)}.")
    lengths = completion_lengths.to(device=rewards.device, dtype=rewards.dtype).reshape(rewards.shape)
    if (lengths < 0).any() or not torch.isfinite(lengths).all():
        raise ValueError("advantage_estimator='opo' got a negative or non-finite completion length.")
    scored = ~torch.isnan(rewards)
    if group_size == 1:
        return torch.where(scored, rewards, torch.zeros_like(rewards))
    r = grouped(torch.nan_to_num(rewards, nan=0.0), group_size)
    weights = grouped(torch.where(scored, lengths, torch.zeros_like(lengths)), group_size)
    total = weights.sum(dim=1, keepdim=True)
    baseline = (weights * r).sum(dim=1, keepdim=True) / total.clamp(min=torch.finfo(rewards.dtype).tiny)
    adv = torch.where((total > 0) & grouped(scored, group_size), r - baseline, torch.zeros_like(r))
    return adv.reshape(rewards.shape)
