"""CTPO (arXiv:2605.07331): cumulative-product token ratio with position-adaptive log-space clip."""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register

# The official code clamps each token log-ratio to ±20 before the cumulative sum and the cumulative log-ratio to
# ≤ 10 before exponentiating (core_algos.py l.1574 and l.1591); kept for parity.
TOKEN_LOG_RATIO_CLAMP = 20.0
CUM_LOG_RATIO_MAX = 10.0
CTPO_RATIO_MODES = ("cumprod", "geomean")


def _validate(config) -> None:
    for name in ("ctpo_clip_low", "ctpo_clip_high", "ctpo_clip_c"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"{name}={value!r} must be a finite positive log-space bound (official defaults: ctpo_clip_low 0.025, "
                "ctpo_clip_high 0.05, ctpo_clip_c 0.05)."
            )
    if not math.isfinite(config.ctpo_power):
        raise ValueError(f"ctpo_power={config.ctpo_power!r} must be finite (official: 0.5 for cumprod, -0.5 geomean).")
    if config.ctpo_ratio_mode not in CTPO_RATIO_MODES:
        raise ValueError(f"ctpo_ratio_mode={config.ctpo_ratio_mode!r} must be one of {CTPO_RATIO_MODES}.")


@register(
    "ctpo",
    name="CTPO (Cumulative Token Policy Optimization)",
    paper="Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective, arXiv:2605.07331",
    official_code="horizon-llm/CTPO@acc40211dbeaa8cb37c2347a8b7ad64192b635c4:verl/trainer/ppo/core_algos.py",
    stage="objective",
    flags={
        "loss_type": "ctpo",
        "ctpo_clip_low": 0.025,
        "ctpo_clip_high": 0.05,
        "ctpo_clip_c": 0.05,
        "ctpo_power": 0.5,
        "ctpo_ratio_mode": "cumprod",
        "loss_aggregation": "global_token_mean",
        "beta": 0.0,
    },
    params=("ctpo_clip_low", "ctpo_clip_high", "ctpo_clip_c", "ctpo_power", "ctpo_ratio_mode"),
    validate=_validate,
)
def ctpo_surrogate(
    ctx: ObjectiveContext,
    *,
    ctpo_clip_low: float,
    ctpo_clip_high: float,
    ctpo_clip_c: float,
    ctpo_power: float,
    ctpo_ratio_mode: str,
) -> torch.Tensor:
    """CTPO per-token surrogate `(B, T)`.

    With token log-ratios `d_k = clamp(logp_k - logp_old_k, ±20)` over the loss mask `m`, the 1-indexed position
    `t = Σ_{k≤t} m_k` of each active token and `s_t = t ** ctpo_power` (official: √t):

        L_t   = Σ_{k≤t} m_k d_k                      ("cumprod": log of Π_{k≤t} r_k)
              = (Σ_{k≤t} m_k d_k) / t                ("geomean": log of the running geometric mean)
        ℓ_t   = min( sg(L_t) + logp_t - sg(logp_t), 10 )       (value L_t, gradient only through token t's own logp)
        ρ_t   = exp(ℓ_t),  ρ̃_t = exp(clamp(ℓ_t, -low·s_t, high·s_t))      (low/high = ctpo_clip_low/high)
        l¹_t  = max(-A ρ_t, -A ρ̃_t)
        l_t   = min(l¹_t, -A exp(c·s_t))  if A < 0,   l_t = l¹_t  otherwise     (c = ctpo_clip_c)

    and `l_t = 0` on masked positions (the official code sets ρ = ρ̃ = 0 there). With the official defaults
    `c = high = 0.05` the dual clip is the upper clip bound: a negative-advantage token whose cumulative ratio is
    above `exp(0.05 √t)` contributes the constant `-A exp(0.05 √t)` (gradient 0), the same bound positive-advantage
    tokens get from the ordinary clip (official-code notes: "CTPO dual-clip = upper bound"). On-policy (ρ = 1) it is
    GRPO's surrogate `-A ρ` (nothing is clipped, since the window always contains 0 in log space).

    Official code: horizon-llm/CTPO@acc40211dbeaa8cb37c2347a8b7ad64192b635c4, `verl/trainer/ppo/core_algos.py`,
    `_compute_policy_loss_cum_token_la_impl` l.1532-1695 (registered as `cum-token-cumprod-la`; defaults
    `la_clip_low=0.025`, `la_clip_high=0.05`, `la_clip_c=0.05`, `clip_ratio_la_power=0.5`, ratio mode
    `cumprod`, `loss_agg_mode="token-mean"`). Mapping and choices:
    - Aggregation defaults to `global_token_mean` (verl's token-mean over the global batch).
    - The official run also applies a sequence-level rollout-correction weight (TIS, cap 5.0) to the loss; in TRL
      that is the vLLM importance-sampling correction, applied by the trainer (`vllm_importance_sampling_*`), not here.
    - The cumulative sum runs over the loss mask (TRL's completion mask times tool mask), as the official code's
      `response_mask`; masked tokens neither add to `L_t` nor advance `t`.
    - `A = 0` takes the `A ≥ 0` branch (loss 0 either way). Token advantages `(B, T)` are used per token.
    - KL (`beta`, default 0 as in the paper's runs) is added by the trainer (TRL's k3).
    - `ctpo_ratio_mode="geomean"` is the official code's other mode (`cum-token-geomean-la`, recommended power
      −0.5); `cumprod` is the paper's method and the default.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`.
    """
    if ctpo_ratio_mode not in CTPO_RATIO_MODES:
        raise ValueError(f"ctpo_ratio_mode={ctpo_ratio_mode!r} must be one of {CTPO_RATIO_MODES}.")
    logps = ctx.logps
    mask = ctx.mask.to(logps.dtype)
    active = mask > 0
    d = torch.clamp(logps - ctx.old_logps, -TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)
    cum = torch.cumsum(d * mask, dim=-1)
    pos = torch.cumsum(mask, dim=-1)  # 1-indexed position among active tokens (0 before the first)
    if ctpo_ratio_mode == "geomean":
        cum = cum / pos.clamp(min=1.0)
    cum = torch.where(active, cum, torch.zeros_like(cum))
    log_ratio = torch.clamp(cum.detach() + logps - logps.detach(), max=CUM_LOG_RATIO_MAX)
    zero = torch.zeros_like(log_ratio)
    ratio = torch.where(active, torch.exp(log_ratio), zero)
    scale = pos.clamp(min=1.0).pow(ctpo_power)
    log_clipped = torch.clamp(log_ratio, min=-ctpo_clip_low * scale, max=ctpo_clip_high * scale)
    clipped_ratio = torch.where(active, torch.exp(log_clipped), zero)
    cap = torch.where(active, torch.exp(ctpo_clip_c * scale), torch.ones_like(scale))
    adv = ctx.advantages
    clipped_loss = torch.maximum(-adv * ratio, -adv * clipped_ratio)
    loss = torch.where(adv < 0, torch.minimum(clipped_loss, -adv * cap), clipped_loss)
    return torch.where(active, loss, zero)
