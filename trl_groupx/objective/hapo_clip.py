"""HAPO's Asymmetric Adaptive Clipping: per-token PPO clip bounds widened by the token's normalised entropy."""

from __future__ import annotations

import math
import warnings

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from ..token_weights.hapo import entropy_h_hat


def _validate(config) -> None:
    if not 0.0 <= config.hapo_clip_entropy_pivot <= 1.0:
        raise ValueError(
            f"hapo_clip_entropy_pivot must lie in [0, 1] (a quantile; official entropy_pivot 0.8), "
            f"got {config.hapo_clip_entropy_pivot!r}."
        )
    if not (math.isfinite(config.hapo_clip_alpha) and config.hapo_clip_alpha >= 0):
        raise ValueError(f"hapo_clip_alpha must be finite and >= 0 (official clip_alpha 1.0), got {config.hapo_clip_alpha!r}.")
    if not config.hapo_clip_c > 1.0:
        raise ValueError(
            f"hapo_clip_c={config.hapo_clip_c!r} must be > 1 (dual-clip cap on the ratio of negative-advantage "
            "tokens; official clip_ratio_c 10.0; use float('inf') for no cap)."
        )


def hapo_clip_bounds(
    h_hat: torch.Tensor, epsilon_low: float, epsilon_high: float, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token `(ε_low, ε_high)` of `ada_clip`: low-entropy tokens (ĥ ≤ 0) get `ε_low (1 − α ĥ)`, high-entropy
    tokens (ĥ > 0) get `ε_high (1 + α ĥ)`; the other bound keeps its base value."""
    low = torch.where(h_hat <= 0, epsilon_low * (1 - alpha * h_hat), torch.full_like(h_hat, epsilon_low))
    high = torch.where(h_hat > 0, epsilon_high * (1 + alpha * h_hat), torch.full_like(h_hat, epsilon_high))
    return low, high


@register(
    "hapo_clip",
    name="HAPO Asymmetric Adaptive Clipping (objective part of HAPO)",
    paper="HAPO: Heterogeneous Adaptive Policy Optimization, https://github.com/starriver030515/HAPO (arXiv id not recorded)",
    official_code="starriver030515/HAPO@7671dde3e268779a949954ec75ed3edda45f7e0a:verl/trainer/ppo/core_algos.py",
    stage="objective",
    flags={
        "loss_type": "hapo_clip",
        "hapo_clip_alpha": 1.0,
        "hapo_clip_entropy_pivot": 0.8,
        "hapo_clip_c": 10.0,
        "hapo_clip_official_sign": False,
        "epsilon": 0.2,
        "epsilon_high": 0.2,
        "loss_aggregation": "global_token_mean",
        "beta": 0.0,
    },
    requires=("entropies",),
    params=("hapo_clip_alpha", "hapo_clip_entropy_pivot", "hapo_clip_c", "hapo_clip_official_sign"),
    validate=_validate,
)
def hapo_clip_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    hapo_clip_alpha: float,
    hapo_clip_entropy_pivot: float,
    hapo_clip_c: float,
    hapo_clip_official_sign: bool,
) -> torch.Tensor:
    """HAPO Asymmetric Adaptive Clipping, per token `(B, T)`.

    With the current policy's entropy `H_t` (`ctx.entropies`), `ĥ_t ∈ [−1, 1]` as in HAPO's `compute_entropy_h`
    (`ℓ = log max(H, 1e-8)`, pivot `m` = the `hapo_clip_entropy_pivot` quantile (0.8, "nearest") of `ℓ` over the
    micro-batch's loss tokens, `h = (ℓ − m)/RMS(ℓ − m)`, `ĥ = h / max h⁺` if `h > 0`, `h / |min h⁻|` otherwise; shared
    with `token_weighting="hapo"`, `trl_groupx.token_weights.hapo.entropy_h_hat`), `α = hapo_clip_alpha`,
    `ε_low = epsilon`, `ε_high = epsilon_high` (or `epsilon`):

        ε_low,t  = ε_low (1 − α ĥ_t)   if ĥ_t ≤ 0 (low entropy),   else ε_low
        ε_high,t = ε_high (1 + α ĥ_t)  if ĥ_t > 0 (high entropy),  else ε_high
        l¹_t = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε_low,t, 1 + ε_high,t)),    ρ_t = exp(logp_t − logp_old_t)
        l_t  = min(l¹_t, −A_t c)  if A_t < 0,   l_t = l¹_t otherwise          (c = hapo_clip_c, official 10)

    So low-entropy tokens may be pushed down further (lower bound down to `1 − ε_low (1 + α)`, 0.6 with the
    defaults) and high-entropy tokens up further (upper bound up to `1 + ε_high (1 + α)`, 1.4). `ĥ` is a
    statistic (no gradient); the gradient flows through `ρ` only, as in PPO. On-policy (ρ = 1) nothing is clipped:
    DAPO's loss (with `global_token_mean`); `α = 0` and `c = ∞` give PPO/DAPO's clipped surrogate exactly.

    Official code: starriver030515/HAPO@7671dde3e268779a949954ec75ed3edda45f7e0a, `verl/trainer/ppo/core_algos.py`:
    `compute_entropy_h` l.86-128, `ada_clip` l.131-144, `compute_policy_loss` l.727-821 (ĥ under `no_grad` from the
    `entropy` of the loss-time forward, `ada_clip` when `adaptive_clip`, PPO clip with the per-token bounds, dual
    clip `clip_ratio_c` for A < 0, `agg_loss` token-mean); `verl/workers/actor/dp_actor.py` l.397-425 (entropy
    computed in the same forward as the log-probs, per micro-batch); run script `recipe/llama3.1_8b_instruct.sh`
    (clip_ratio_low/high 0.2, clip_ratio_c 10.0, entropy_pivot 0.8, adaptive_clip True, clip_alpha 1.0).
    Paper vs code, and choices:
    - Sign of ĥ: the official `scale_neg = 1/neg_min` with `neg_min < 0` makes `ĥ = |ĥ_paper| ≥ 0` for every token,
      so `ε_low` never adapts and `ε_high` is widened for low- *and* high-entropy tokens (official-code notes). The
      paper's description (aggressive down-clip for low-entropy tokens, more room up for high-entropy ones) needs
      the signed ĥ: the paper wins by default; `hapo_clip_official_sign=True` reproduces the code (`ĥ → |ĥ|`).
    - Entropies: the official code uses the current policy's entropies from the loss-time forward, with the
      statistics (pivot quantile, RMS, max/min) taken over the micro-batch; `ctx.entropies` is exactly that (current
      policy, detached, this micro-batch's loss tokens). (The token stage `token_weighting="hapo"` uses rollout-time
      entropies over the global batch instead; they coincide in value only on the first update of a batch and when
      the micro-batch is the whole batch.) Consequence: the clip bounds depend on which rows share a micro-batch,
      so off-policy the loss is not exactly invariant to the gradient-accumulation split (the official code has the
      same dependence); on-policy nothing is clipped and it is.
    - Aggregation defaults to `global_token_mean` (verl's token-mean, split-invariant scale); `token_mean` gives the
      official per-micro-batch token mean.
    - `A = 0` takes the `A ≥ 0` branch (loss 0 either way); per-token advantages `(B, T)` (e.g. from
      `token_weighting="hapo"`) are used per token. HAPO's Differential Advantage Redistribution and Token Level Group
      Average are the token stage (`token_weighting="hapo"`), Adaptive Temperature Sampling the sampling stage;
      this objective is only the clipping. The official code's DAR (`ada_advantage`) would see the adaptive bounds
      when both are on; our token stage applies DAR at ratio 1, where the neutral zone contains 1 for any bounds, so
      the composition is the same on the first update.
    - KL (`beta`, 0 as in HAPO's runs) is added by the trainer.
    - Without entropies in the context (the trainer always passes them; only a bare call lacks them) ĥ = 0, i.e.
      the base bounds, with a warning.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask`, `ctx.entropies` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    mask = ctx.mask > 0
    if ctx.entropies is None:  # never from the trainer (it always computes them for objectives)
        warnings.warn("loss_type='hapo_clip' got no entropies: ĥ = 0, the clip bounds are the base ones.", stacklevel=2)
        h_hat = torch.zeros_like(ctx.logps)
    else:
        h_hat = entropy_h_hat(ctx.entropies.detach().float(), mask, hapo_clip_entropy_pivot).to(ctx.logps.dtype)
    if hapo_clip_official_sign:
        h_hat = h_hat.abs()
    low, high = hapo_clip_bounds(h_hat, epsilon, eps_high, hapo_clip_alpha)
    ratio = torch.exp(torch.where(mask, ctx.logps - ctx.old_logps, torch.zeros_like(ctx.logps)))
    adv = ctx.advantages
    clipped_loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
    loss = torch.where(adv < 0, torch.minimum(clipped_loss, -adv * hapo_clip_c), clipped_loss)
    return torch.where(mask, loss, torch.zeros_like(loss))
