"""REINFORCE++ (no baseline): outcome reward broadcast over tokens, then token-level batch whitening (verl)."""

from __future__ import annotations

import torch

from ..registry import register
from ._checks import reject_infinite

# verl masked_whiten: (x - mean) * rsqrt(var + 1e-8)
WHITEN_EPS = 1e-8


@register(
    "reinforce_pp",
    name="REINFORCE++ (no baseline; global token-level whitening of the outcome return)",
    paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, arXiv:2501.03262",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="advantages",
    requires=("completion_lengths",),
)
def reinforce_pp_advantages(
    rewards: torch.Tensor, group_size: int, *, completion_lengths: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++ without baseline: `A_i = (r_i − μ) / sqrt(σ² + 1e-8)` with token-weighted batch statistics.

    With an outcome reward placed on the last completion token and γ = 1 the return at every completion token is
    the rollout's reward `r_i`; verl then whitens these returns over all valid tokens of the batch. With
    completion lengths `L_i` (the trainer supplies them: `requires=("completion_lengths",)`) that is exactly

        `T = Σ L_i`,  `μ = Σ L_i r_i / T`,
        `σ² = Σ L_i (r_i − μ)² / (T − 1)`   (unbiased: Bessel correction over tokens),
        `A_i = (r_i − μ) · rsqrt(σ² + 1e-8)`,

    so each rollout is weighted by its length, matching verl to rounding. (verl's `masked_mean` divides by
    `T + 1e-8`, a division guard; we divide by `T` — the relative difference is ~1e-8/T, and an all-equal batch
    gets exactly 0 here where verl leaves a ~1e-5 residual.) No group baseline: `group_size` is
    unused (the prompt grouping plays no role), and all-equal groups keep a nonzero advantage whenever the batch
    has spread.

    Reference: verl (peer framework)
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py,
    `compute_reinforce_plus_plus_outcome_advantage` (l.694-735: discounted return over masked tokens, then
    `masked_whiten`), with verl/utils/torch_functional.py `masked_mean`/`masked_var`/`masked_whiten` (l.300-346).

    Choices: γ is fixed to 1 (verl's default): with γ < 1 the return varies along the tokens, which a per-rollout
    advantage cannot express. NaN rewards (unscored) and zero-length completions are left out of the statistics
    and get 0 (a zero-length completion has no token in verl); fewer than two counted tokens give all zeros
    (verl raises); ±inf rewards and negative or non-finite lengths raise a `ValueError`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, NaN where unscored.
        group_size (`int`): `G` (unused).
        completion_lengths (`torch.Tensor`): `(N,)` number of completion tokens per rollout (trainer-supplied).

    Returns:
        `torch.Tensor`: `(N,)` advantages, dtype of `rewards` (computed in float64).
    """
    reject_infinite(rewards, "reinforce_pp")
    if completion_lengths.numel() != rewards.numel():
        raise ValueError(f"advantage_estimator='reinforce_pp': completion_lengths {tuple(completion_lengths.shape)} "
                         f"does not match rewards {tuple(rewards.shape)}.")
    lengths = completion_lengths.detach().to(device=rewards.device, dtype=torch.float64).reshape(rewards.shape)
    if not torch.isfinite(lengths).all() or (lengths < 0).any():
        raise ValueError("advantage_estimator='reinforce_pp' got a negative or non-finite completion length.")
    r = rewards.detach().to(torch.float64)
    counted = ~torch.isnan(r) & (lengths > 0)
    w = torch.where(counted, lengths, torch.zeros_like(lengths))
    r0 = torch.where(counted, r, torch.zeros_like(r))
    total = w.sum()
    if total < 2:
        return torch.zeros_like(rewards)
    mean = (w * r0).sum() / total
    var = (w * (r0 - mean) ** 2).sum() / (total - 1)
    adv = (r0 - mean) * torch.rsqrt(var + WHITEN_EPS)
    return torch.where(counted, adv, torch.zeros_like(adv)).to(rewards.dtype)
