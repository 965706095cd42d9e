"""Objective stage: per-token surrogates (what is optimised) and aggregation (how it is normalised), kept apart.

Contract (see `trl_groupx.contracts`): `fn(ctx: ObjectiveContext, *, <config fields>) -> per-token loss (B, T)`.
Aggregation is `aggregate(per_token_loss, mask, mode, ...)`, chosen by `loss_aggregation`.

TRL's own `loss_type`s are registered as native variants: TRL computes them, and the functions here are our pure
references of the same formulas, checked against TRL's loss in `tests/test_objective.py`.
"""

from __future__ import annotations

from typing import Literal

import torch

from .contracts import ObjectiveContext
from .registry import register

Aggregation = Literal["sequence_mean", "token_mean", "global_token_mean", "constant", "sequence_sum"]
AGGREGATIONS: tuple[str, ...] = ("sequence_mean", "token_mean", "global_token_mean", "constant", "sequence_sum")

# TRL's loss types (grpo_trainer.py `_compute_loss`) and the aggregation each one implies.
TRL_LOSS_AGGREGATION: dict[str, str] = {
    "grpo": "sequence_mean",
    "sapo": "sequence_mean",
    "bnpo": "token_mean",
    "dr_grpo": "constant",
    "dapo": "global_token_mean",
    "cispo": "global_token_mean",
    "vespo": "global_token_mean",
    "luspo": "sequence_sum",
}


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_num_tokens: float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Reduce a `(B, T)` per-token loss to a scalar.

    - `sequence_mean`: `mean_i (Σ_t l_it m_it / max(1, Σ_t m_it))` (GRPO, SAPO, GMPO).
    - `token_mean`: `Σ l m / max(1, Σ m)` over the micro-batch (BNPO).
    - `global_token_mean`: `Σ l m / global_num_tokens` where the caller passes the active-token count of the
      accumulation window on this process (DAPO, CISPO).
    - `constant`: `Σ l m / (B · max_completion_length)` (Dr. GRPO).
    - `sequence_sum`: `mean_i Σ_t l_it m_it` (LUSPO).
    """
    per_token_loss = per_token_loss * mask
    if mode == "sequence_mean":
        return (per_token_loss.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "token_mean":
        return per_token_loss.sum() / mask.sum().clamp(min=1.0)
    if mode == "global_token_mean":
        if global_num_tokens is None:
            raise ValueError("aggregate(mode='global_token_mean') needs global_num_tokens.")
        return per_token_loss.sum() / global_num_tokens
    if mode == "constant":
        if max_completion_length is None:
            raise ValueError("aggregate(mode='constant') needs max_completion_length.")
        return per_token_loss.sum() / (per_token_loss.size(0) * max_completion_length)
    if mode == "sequence_sum":
        return per_token_loss.sum(-1).mean()
    raise ValueError(f"Unknown loss_aggregation {mode!r}; expected one of {AGGREGATIONS}.")


def log_ratio(ctx: ObjectiveContext, importance_sampling_level: str) -> torch.Tensor:
    """`logp - logp_old` per token `(B, T)`, or its masked mean per sequence `(B, 1)` (GSPO)."""
    token_log_ratio = ctx.logps - ctx.old_logps
    if importance_sampling_level == "sequence":
        return ((token_log_ratio * ctx.mask).sum(-1) / ctx.mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return token_log_ratio


@register(
    "dapo",
    name="DAPO (Decoupled Clip and Dynamic sAmpling Policy Optimization)",
    paper="DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv:2503.14476",
    official_code=None,
    stage="objective",
    flags={"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "mask_truncated_completions": True},
    native=True,
)
def clipped_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    delta: float | None,
    importance_sampling_level: str,
) -> torch.Tensor:
    """PPO clipped surrogate with decoupled bounds (TRL's `grpo`/`bnpo`/`dr_grpo`/`dapo` share it).

    `l_t = -min(ρ_t A_t, clip(ρ_t, 1-ε_low, 1+ε_high) A_t)`, `ρ_t = exp(logp_t - logp_old_t)` per token, or one
    length-normalised ratio per sequence (GSPO) when `importance_sampling_level="sequence"`. With `delta`, the
    unclipped branch is capped at `delta` (INTELLECT-2 two-sided clipping). DAPO's contribution at this stage is the
    clip-higher `ε_high = 0.28` and the `global_token_mean` aggregation; its dynamic sampling is a sampling variant.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(log_ratio(ctx, importance_sampling_level))
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.min(ratio * ctx.advantages, clipped * ctx.advantages)


# Dr. GRPO and GSPO change the aggregation / ratio level around the same surrogate.
register(
    "dr_grpo",
    name="Dr. GRPO (GRPO Done Right)",
    paper="Understanding R1-Zero-Like Training: A Critical Perspective, arXiv:2503.20783",
    official_code=None,
    stage="objective",
    flags={"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0},
    native=True,
)(clipped_surrogate)
register(
    "gspo",
    name="GSPO (Group Sequence Policy Optimization)",
    paper="Group Sequence Policy Optimization, arXiv:2507.18071",
    official_code=None,
    stage="objective",
    flags={"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4,
           "beta": 0.0},
    native=True,
)(clipped_surrogate)


@register(
    "cispo",
    name="CISPO (Clipped IS-weight Policy Optimization)",
    paper="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention, arXiv:2506.13585",
    official_code=None,
    stage="objective",
    flags={"loss_type": "cispo", "epsilon_high": 5.0, "beta": 0.0},
    native=True,
)
def cispo_surrogate(
    ctx: ObjectiveContext, *, epsilon: float, epsilon_high: float | None, importance_sampling_level: str
) -> torch.Tensor:
    """CISPO: `l_t = -sg(min(ρ_t, ε_max)) A_t logp_t` — the IS weight is clipped and detached, the gradient flows
    through `logp_t`. TRL caps at `ε_max = epsilon_high` (verl clips to `[1-ε, 1+ε_high]`)."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    weight = torch.clamp(torch.exp(log_ratio(ctx, importance_sampling_level)), max=eps_high).detach()
    return -weight * ctx.advantages * ctx.logps


@register(
    "sapo",
    name="SAPO (Soft Adaptive Policy Optimization)",
    paper="Soft Adaptive Policy Optimization, arXiv:2511.20347",
    official_code=None,
    stage="objective",
    flags={"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05},
    native=True,
)
def sapo_surrogate(
    ctx: ObjectiveContext,
    *,
    sapo_temperature_pos: float,
    sapo_temperature_neg: float,
    importance_sampling_level: str,
) -> torch.Tensor:
    """SAPO: hard clip replaced by a smooth gate, `l_t = -(4/τ) σ(τ (ρ_t - 1)) A_t`, `τ = τ_pos` if `A_t > 0` else
    `τ_neg`; the gate's slope at `ρ = 1` is 1, as the clipped surrogate's."""
    ratio = torch.exp(log_ratio(ctx, importance_sampling_level))
    tau = torch.where(ctx.advantages > 0, sapo_temperature_pos, sapo_temperature_neg)
    return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * ctx.advantages


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
