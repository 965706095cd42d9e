"""REINFORCE++-baseline: group-mean subtraction then batch whitening (arXiv:2501.03262), as verl's estimator."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite

# verl's masked_whiten: (x - mean) * rsqrt(var + 1e-8)
WHITEN_EPS = 1e-8


@register(
    "reinforce_pp_baseline",
    name="REINFORCE++-baseline (group mean baseline + global batch whitening)",
    paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, arXiv:2501.03262",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="advantages",
)
def reinforce_pp_baseline_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the whole (global) batch.

    `c_i = r_i − mean_g(r)` (a group with one scored rollout keeps `c_i = r_i`: baseline 0), then
    `A_i = (c_i − mean(c)) / sqrt(var(c) + 1e-8)` with the unbiased variance over all scored rollouts of the batch.
    Unlike GRPO the scale is shared by the batch (no per-group std), so easy and hard prompts keep their relative
    advantage magnitudes.

    Reference: verl (peer framework)
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py,
    `compute_reinforce_plus_plus_baseline_outcome_advantage` (l.533-584) with
    verl/utils/torch_functional.py `masked_whiten`/`masked_var` (l.311-346, same commit): singleton groups get
    mean 0; whitening eps 1e-8 inside the rsqrt; Bessel correction.

    Differences from verl (the advantage contract has no completion lengths): verl whitens the advantage broadcast
    over *tokens*, so its mean and variance weight each rollout by its completion length and its Bessel factor
    counts tokens (`n_tok/(n_tok−1)`); here each rollout counts once (`n/(n−1)`). With equal lengths `L` the means
    agree and the results differ only by the factor `sqrt((nL−1)/(nL)·n/(n−1))`; exact parity needs the lengths
    (see the report on the contract). NaN rewards (unscored) are left out of both statistics and get 0; fewer
    than two scored rollouts in the batch give 0 (verl raises); ±inf rewards raise a `ValueError`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "reinforce_pp_baseline")
    by_group = grouped(rewards, group_size)
    scored = ~torch.isnan(by_group)
    m = scored.sum(dim=1, keepdim=True)
    mean = torch.nanmean(by_group, dim=1, keepdim=True)
    centred = torch.where(m > 1, by_group - mean, by_group).reshape(rewards.shape)  # NaN stays NaN
    n = (~torch.isnan(centred)).sum()
    if n < 2:
        return torch.zeros_like(rewards)
    batch_mean = torch.nanmean(centred)
    var = torch.nansum((centred - batch_mean) ** 2) / (n - 1)
    return torch.nan_to_num((centred - batch_mean) * torch.rsqrt(var + WHITEN_EPS), nan=0.0)
