"""DPPO-Binary-TV and DPPO-Binary-KL (arXiv:2602.04879): a trust region on an estimate of the policy divergence
(total variation or KL of the sampled token's binary distribution) instead of PPO's ratio clip."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register

PAPER = "Rethinking the Trust Region in LLM Reinforcement Learning, arXiv:2602.04879"
OFFICIAL = "verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py"
LOG_RATIO_CLAMP = 20.0  # verl clamps the log-ratio before exp (l.1420, l.1501)
BINARY_KL_EPS = 1e-8  # verl's guard inside log((1 - p_old) / (1 - p))


def _masked_pg(ctx: ObjectiveContext, valid: torch.Tensor, is_cap: float) -> torch.Tensor:
    """`-A_t · sg(min(ρ_t, C)) · logp_t · valid_t`: gradient `-A min(ρ, C) ∇logp` inside the region, else 0."""
    ratio = torch.exp(torch.clamp(ctx.logps - ctx.old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = torch.clamp(ratio, max=is_cap).detach()
    return -ctx.advantages * weight * ctx.logps * valid.detach().to(ctx.logps.dtype)


def _validate(delta_field: str, cap_field: str):
    def validate(config) -> None:
        if not getattr(config, delta_field) > 0:
            raise ValueError(f"{delta_field}={getattr(config, delta_field)!r} must be > 0 (the trust-region radius).")
        if not getattr(config, cap_field) >= 1:
            raise ValueError(f"{cap_field}={getattr(config, cap_field)!r} must be >= 1 (a cap on the IS weight).")

    return validate


_DOC_COMMON = """
    Shared by both: the surrogate is the detached-weight policy gradient `l_t = -A_t · sg(min(ρ_t, C)) · logp_t ·
    m_t` (C = truncated-IS cap), so the gradient is `-A_t min(ρ_t, C) ∇logp_t` (= PPO's unclipped `-A ∇ρ` when
    `ρ < C`) on tokens inside the trust region and 0 outside; the loss *value* is `-A·w·logp`, not `-A·ρ`. Tokens
    are only masked when the update moves in the direction the advantage pushes (A > 0: probability up; A ≤ 0:
    down). `A = 0` takes the `A ≤ 0` branch (loss 0 either way).

    Defaults from the authors' verl example `examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh` (l.15-24, 76-79):
    δ_TV = 0.15, δ_KL = 0.05 (both sides), `clip_ratio_c = 10000` (effectively no truncation; verl's code falls
    back to 20 when unset), `loss_agg_mode = seq-mean-token-sum-norm`, i.e. `Σ l m / (B · T_max)` = our
    `constant` (verl's horizon is the padded length; ours `max_completion_length`), no KL loss.
    Official code: verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9, `verl/trainer/ppo/core_algos.py`,
    `compute_policy_loss_dppo_tv` l.1379-1457 and `compute_policy_loss_dppo_kl` l.1460-1542. verl reuses
    `clip_ratio_low/high` as the divergence radius; here it has its own field, symmetric as in the example.
    Conventions: no dual clip (DPPO replaces it with the truncated IS weight, as verl's code notes); log-ratio
    clamped to ±20 before `exp`, as verl; reference KL only if `beta != 0` (TRL's k3, ×ratio when
    `use_bias_correction_kl`, TRL's default; verl's `use_kl_loss` adds an unweighted k3).
"""


@register(
    "dppo_tv",
    name="DPPO-Binary-TV (Divergence Proximal Policy Optimization)",
    paper=PAPER,
    official_code=OFFICIAL,
    stage="objective",
    flags={"loss_type": "dppo_tv", "dppo_tv_delta": 0.15, "dppo_tv_is_cap": 10000.0, "beta": 0.0,
           "loss_aggregation": "constant"},
    params=("dppo_tv_delta", "dppo_tv_is_cap"),
    validate=_validate("dppo_tv_delta", "dppo_tv_is_cap"),
)
def dppo_tv_surrogate(ctx: ObjectiveContext, *, dppo_tv_delta: float, dppo_tv_is_cap: float) -> torch.Tensor:
    """DPPO-Binary-TV, per token `(B, T)`: the trust region is `|p_t - p_old_t| ≤ δ` on the sampled token's
    probability (the total variation of the binary distribution {token, rest}):

        valid_t = (p_t - p_old_t ≤ δ)   if A_t > 0,      valid_t = (p_t - p_old_t ≥ -δ)   otherwise
    """
    prob, old_prob = torch.exp(ctx.logps), torch.exp(ctx.old_logps)
    valid = torch.where(ctx.advantages > 0, prob - old_prob <= dppo_tv_delta, prob - old_prob >= -dppo_tv_delta)
    return _masked_pg(ctx, valid, dppo_tv_is_cap)


@register(
    "dppo_kl",
    name="DPPO-Binary-KL (Divergence Proximal Policy Optimization)",
    paper=PAPER,
    official_code=OFFICIAL,
    stage="objective",
    flags={"loss_type": "dppo_kl", "dppo_kl_delta": 0.05, "dppo_kl_is_cap": 10000.0, "beta": 0.0,
           "loss_aggregation": "constant"},
    params=("dppo_kl_delta", "dppo_kl_is_cap"),
    validate=_validate("dppo_kl_delta", "dppo_kl_is_cap"),
)
def dppo_kl_surrogate(ctx: ObjectiveContext, *, dppo_kl_delta: float, dppo_kl_is_cap: float) -> torch.Tensor:
    """DPPO-Binary-KL, per token `(B, T)`: the trust region is a KL of the binary distribution {token, rest}:

        KL_t = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        valid_t = KL_t ≤ δ or p_t ≤ p_old_t   if A_t > 0,      valid_t = KL_t ≤ δ or p_t ≥ p_old_t   otherwise
    """
    prob, old_prob = torch.exp(ctx.logps), torch.exp(ctx.old_logps)
    binary_kl = old_prob * (ctx.old_logps - ctx.logps) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + BINARY_KL_EPS) / (1.0 - prob + BINARY_KL_EPS)
    )
    inside = binary_kl <= dppo_kl_delta
    valid = torch.where(ctx.advantages > 0, inside | (prob <= old_prob), inside | (prob >= old_prob))
    return _masked_pg(ctx, valid, dppo_kl_is_cap)


dppo_tv_surrogate.__doc__ += _DOC_COMMON
dppo_kl_surrogate.__doc__ += _DOC_COMMON
