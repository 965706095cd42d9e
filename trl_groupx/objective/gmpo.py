"""GMPO: geometric-mean policy optimization (arXiv:2507.20673)."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register


@register(
    "gmpo",
    name="GMPO (Geometric-Mean Policy Optimization)",
    paper="Geometric-Mean Policy Optimization, arXiv:2507.20673",
    official_code="callsys/GMPO@205b2bf412f150cf96c29b33273b81bcd1a9b20f:train_zero_math_gmpo.py",
    stage="objective",
    flags={"loss_type": "gmpo", "gmpo_clip": 0.4, "loss_aggregation": "sequence_mean", "beta": 0.0},
    params=("gmpo_clip",),
)
def gmpo_surrogate(ctx: ObjectiveContext, *, gmpo_clip: float) -> torch.Tensor:
    """GMPO: maximise the geometric mean of token ratios instead of their arithmetic mean.

    Per sequence `i` with token log-ratios `d_t = logp_t - logp_old_t` and clip `c` (paper: 0.4):

        d̃_t = min(d_t, c)  if A_i ≥ 0,   d̃_t = max(d_t, -c)  if A_i < 0      (one-sided, in log space, per token)
        ℓ_i  = -A_i · exp( (1/|o_i|) Σ_t d̃_t )

    i.e. PPO's `min(ρA, clip(ρ, e^{-c}, e^{c})A)` applied token by token before a geometric mean. The gradient on an
    unclipped token is `-A_i exp(m_i) / |o_i|`, shared by all of them (0 on clipped tokens and padding), which is
    why outlier ratios move the update less than in GRPO.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)` (token
    advantages are averaged over the completion first, as verl's `compute_policy_loss_geo_mean` does). Returns
    `ℓ_i` broadcast to `(B, T)`: with the default `loss_aggregation="sequence_mean"` the total loss is
    `mean_i ℓ_i`, the official code's reduction (one sequence per micro-batch, averaged by gradient accumulation).

    Official code: callsys/GMPO@205b2bf412f150cf96c29b33273b81bcd1a9b20f, `train_zero_math_gmpo.py`,
    `ZeroMathLearner.learning_step` l.675-701; verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9,
    `verl/trainer/ppo/core_algos.py:compute_policy_loss_geo_mean`; TRL 1.16 `trl/experimental/gmpo`. Choices
    where they differ: `A = 0` takes the `A ≥ 0` branch (official; verl's `sign(0)=0` gives the same zero loss);
    an empty completion has `|o| = 0` → mean log-ratio 0 (TRL's clamp; the official code divides by zero). The
    advantages' std epsilon is the advantage stage's (TRL: 1e-4; official: 1e-8).
    """
    mask = ctx.mask
    length = mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    adv = ctx.advantages
    if adv.shape[-1] != 1:
        adv = (adv * mask).sum(-1, keepdim=True) / length
    token_log_ratio = ctx.logps - ctx.old_logps  # (B, T)
    clipped = torch.where(
        adv >= 0, torch.clamp(token_log_ratio, max=gmpo_clip), torch.clamp(token_log_ratio, min=-gmpo_clip)
    )
    seq_ratio = torch.exp((clipped * mask).sum(-1, keepdim=True) / length)  # (B, 1)
    return (-adv * seq_ratio).expand_as(token_log_ratio)
