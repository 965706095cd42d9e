"""RLOO: leave-one-out baseline (arXiv:2402.14740), as verl's `rloo` advantage estimator (peer-framework extra)."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite


@register(
    "rloo",
    name="RLOO (REINFORCE Leave-One-Out baseline)",
    paper="Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs, "
    "arXiv:2402.14740",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="advantages",
)
def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO advantage: each rollout's reward minus the mean reward of the *other* rollouts of its group.

    `A_i = r_i − (1/(M−1)) Σ_{j≠i} r_j = M/(M−1) · (r_i − mean_g(r))` for a group with `M` scored rollouts. No
    std division; the advantages of a group sum to zero; an all-equal group gets 0.

    Reference: verl (peer framework; not in TRL's GRPO trainer)
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py,
    `compute_rloo_outcome_advantage` (l.587-636: `r·M/(M−1) − mean·M/(M−1)`) and
    `compute_rloo_vectorized_outcome_advantage` (l.833-868: `(c·r − Σr)/(c−1)·[c>1]`), identical for `M ≥ 2`.

    Choices: a group with one scored rollout (`G = 1`) has no leave-one-out baseline and gets 0, as verl's
    vectorised `rloo_vectorized` (its loop version `rloo` passes the raw reward through instead). NaN rewards
    (unscored) are left out of `M` and the sum and get 0; ±inf rewards raise a `ValueError`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "rloo")
    by_group = grouped(rewards, group_size)
    scored = ~torch.isnan(by_group)
    m = scored.sum(dim=1, keepdim=True).to(rewards.dtype)
    total = torch.nansum(by_group, dim=1, keepdim=True)
    adv = (m * by_group - total) / (m - 1).clamp(min=1)
    adv = torch.where(scored & (m > 1), adv, torch.zeros_like(adv))
    return adv.reshape(rewards.shape)
