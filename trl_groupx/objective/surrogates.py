"""TRL's own surrogates, registered as native presets: our pure references of TRL's formulas, checked against TRL's
loss in `tests/integration/test_variant_training.py`."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .turn_ratio import TURN_LEVEL, turn_log_ratio


def log_ratio(ctx: ObjectiveContext, importance_sampling_level: str) -> torch.Tensor:
    """`logp - logp_old` per token `(B, T)`, or its masked mean per sequence `(B, 1)` (GSPO), or per assistant turn
    on the turn's tokens `(B, T)` (`"turn"`, GAGPO's action-level ratio: `turn_ratio.turn_log_ratio`)."""
    token_log_ratio = ctx.logps - ctx.old_logps
    if importance_sampling_level == "sequence":
        return ((token_log_ratio * ctx.mask).sum(-1) / ctx.mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    if importance_sampling_level == TURN_LEVEL:
        return turn_log_ratio(token_log_ratio, ctx.mask, ctx.turn_ids)
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
    length-normalised ratio per sequence (GSPO) when `importance_sampling_level="sequence"`, or per assistant turn
    (`"turn"`, `turn_ratio.turn_log_ratio`; trl_groupx objectives only). With `delta`, the
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


# TRL's loss types → the registered reference of their surrogate. The trainer uses it when a trl_groupx setting that
# lives inside the loss (e.g. `kl_estimator`) is combined with a TRL loss type; `vespo` and `luspo` have none.
TRL_REFERENCE_SURROGATE: dict[str, str] = {
    "grpo": "dapo", "bnpo": "dapo", "dr_grpo": "dr_grpo", "dapo": "dapo", "cispo": "cispo", "sapo": "sapo",
}
