"""GOPO: rank-only group advantages (Group Ordinal Policy Optimization, arXiv:2602.03876)."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite


@register(
    "gopo",
    name="GOPO (Group Ordinal Policy Optimization)",
    paper="GOPO: Policy Optimization using Ranked Rewards, arXiv:2602.03876",
    official_code="friendshipkim/gopo@02e2b9fa41d5a1dcee593d59b56eb85f9ed24d1f:src/open_r1/grpo_trainer.py",
    stage="advantages",
)
def gopo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GOPO: replace reward magnitudes by their within-group rank, mapped linearly onto `[−2, 2]`.

    `A_i = 2 − 4 (rank_i − 1) / (M − 1)`, with `rank_i ∈ [1, M]` the rank of `r_i` among the `M` scored rollouts of
    its group in *descending* order (the best rollout gets `+2`, the worst `−2`, the advantages of a group sum to
    zero). Only the ordering matters: any strictly increasing transform of the rewards leaves the advantages
    unchanged ([0.1, 5.0, 0.2] and [1, 3, 2] both give [−2, 2, 0]). Paper: `Â_i = 2 − (ρ(i) − 1)·4/(G − 1)`.

    Official code: friendshipkim/gopo@02e2b9fa41d5a1dcee593d59b56eb85f9ed24d1f, `src/open_r1/grpo_trainer.py`,
    `GRPOTrainer._generate_and_score_completions` l.1312-1333 (`advantage == "ranking"`: double `argsort`,
    `values = 2.0 - 4.0 * (ranks - 1) / (num_generations - 1)`); loss l.1483-1516 is TRL's token-mean loss, so
    any `loss_type` applies here.

    Where we differ from the official code (../shared/official-code.md): it breaks reward ties arbitrarily (by sort
    order), so an all-equal group gets a spread of ±2 and tied rollouts get different credit; we give tied rewards
    their *averaged* rank (`rank_i = 1 + #{j: r_j > r_i} + #{j ≠ i: r_j = r_i} / 2`), which is what "only the
    ranking matters" implies: an all-equal group gets 0 and the result is invariant under any monotone transform.
    Without ties the two agree exactly. The arbitrary tie-break is a defect, not an option, so it is not exposed.

    Edge cases (choices): NaN rewards (unscored) are left out of the ranking (`M` counts scored rollouts only) and
    get 0; a group with one scored rollout (`G = 1`) gets 0 (the official code divides by `G − 1 = 0`); ±inf rewards
    raise a `ValueError` (their rank would be meaningful, but an infinite reward is a reward-function bug).

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.

    Returns:
        `torch.Tensor`: `(N,)` advantages in `[−2, 2]`.
    """
    reject_infinite(rewards, "gopo")
    by_group = grouped(rewards, group_size)  # (P, G)
    scored = ~torch.isnan(by_group)
    both = scored.unsqueeze(2) & scored.unsqueeze(1)  # (P, G, G): i and j scored
    mine, other = by_group.unsqueeze(2), by_group.unsqueeze(1)
    above = ((other > mine) & both).sum(dim=2).to(rewards.dtype)
    ties = ((other == mine) & both).sum(dim=2).to(rewards.dtype) - 1.0  # minus i itself
    rank = 1.0 + above + ties / 2.0
    m = scored.sum(dim=1, keepdim=True).to(rewards.dtype)
    adv = 2.0 - 4.0 * (rank - 1.0) / (m - 1.0).clamp(min=1.0)
    adv = torch.where(scored & (m > 1), adv, torch.zeros_like(adv))
    return adv.reshape(rewards.shape)
