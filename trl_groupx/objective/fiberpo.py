"""FiberPO: Fibration Policy Optimization (arXiv:2603.08239), trajectory/token two-level gate."""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register

# Numerical guards (ours): each token log-ratio is clamped to ±20 before anything else, as CTPO's official code does,
# and the gated log-ratio to ≤ 20 before exponentiating (the rollback zone of a negative-advantage trajectory raises
# it with the downward excess).
TOKEN_LOG_RATIO_CLAMP = 20.0
GATED_LOG_RATIO_MAX = 20.0


def _validate(config) -> None:
    for name in ("fiberpo_epsilon", "fiberpo_c_pos", "fiberpo_c_neg"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"{name}={value!r} must be a finite positive log-space bound (defaults: fiberpo_epsilon 0.05, "
                "fiberpo_c_pos 0.28, fiberpo_c_neg 0.2)."
            )
    if not config.fiberpo_epsilon < config.fiberpo_c_pos + config.fiberpo_c_neg:
        raise ValueError(
            f"fiberpo_epsilon={config.fiberpo_epsilon!r} must be below fiberpo_c_pos + fiberpo_c_neg "
            f"({config.fiberpo_c_pos + config.fiberpo_c_neg!r}): the paper requires the fibre band to be much narrower "
            "than the trajectory band (ε ≪ C+ + C−). Lower fiberpo_epsilon or widen the trajectory budgets."
        )
    slope = config.fiberpo_rollback_slope
    if not (math.isfinite(slope) and slope >= 0):
        raise ValueError(
            f"fiberpo_rollback_slope={slope!r} must be finite and ≥ 0 (0 = flat clip beyond the trajectory budget, "
            "1 = reflection, the default)."
        )


@register(
    "fiberpo",
    name="FiberPO (Fibration Policy Optimization), trajectory/token gate",
    paper="Fibration Policy Optimization, arXiv:2603.08239",
    official_code=None,
    stage="objective",
    flags={
        "loss_type": "fiberpo",
        "fiberpo_epsilon": 0.05,
        "fiberpo_c_pos": 0.28,
        "fiberpo_c_neg": 0.2,
        "fiberpo_rollback_slope": 1.0,
        "loss_aggregation": "sequence_mean",
        "beta": 0.0,
    },
    params=("fiberpo_epsilon", "fiberpo_c_pos", "fiberpo_c_neg", "fiberpo_rollback_slope"),
    validate=_validate,
)
def fiberpo_surrogate(
    ctx: ObjectiveContext,
    *,
    fiberpo_epsilon: float,
    fiberpo_c_pos: float,
    fiberpo_c_neg: float,
    fiberpo_rollback_slope: float,
) -> torch.Tensor:
    """FiberPO per-token surrogate `(B, T)`: the token ratio factored into a trajectory part (base) and a per-token
    residual (fibre), each gated by its own trust region, `l_t = -A_t ρ_t`.

    Per trajectory, with token log-ratios `l_t = clamp(logp_t - logp_old_t, ±20)` over the loss mask:

        u_t = 1[l_t > 0],  v_t = 1 - u_t                       (upward / downward tokens, n⁺ and n⁻ of them)
        log s⁺ = μ⁺ = Σ_t u_t l_t / n⁺ ≥ 0,   log s⁻ = μ⁻ = Σ_t v_t (-l_t) / n⁻ ≥ 0      (same-sign means)
        δ_t = l_t - μ⁺  if u_t,   δ_t = l_t + μ⁻  otherwise   (deviation from the same-sign trajectory mean)
        g(x, C) = x  for x ≤ C,   C - κ (x - C)  for x > C     (κ = fiberpo_rollback_slope: the rollback zone)
        w_base = exp(g(μ⁺, C⁺)) / exp(g(μ⁻, C⁻))
        r̃_t = exp(clip(δ_t, ±ε) + μ⁻)  if u_t,   exp(clip(δ_t, ±ε) - μ⁺)  otherwise
        ρ_t = w_base · r̃_t

    i.e. `log ρ_t = l_t + [g(μ⁺, C⁺) - μ⁺] - [g(μ⁻, C⁻) - μ⁻] + [clip(δ_t, ±ε) - δ_t]`: inside both bands `ρ_t = r_t`
    (the token ratio), so the Jacobian of the gated log-ratios w.r.t. the raw ones is the identity there (in
    particular on-policy, where FiberPO's gradient is the vanilla policy gradient `-A ∇log π`), and it only couples
    tokens of the same trajectory (block-diagonal over trajectories). Gradient structure:
    - **Fibre gate**: a token whose residual leaves the band (`|δ_t| > ε`) is censored: its ratio keeps its clipped
      value but carries no gradient, and its log-prob is detached from the means `μ±` its siblings' terms read, so
      its gradient is exactly 0; in-band siblings keep `-A ρ_s ∇log π_s` (plus the base term below).
    - **Base gate** (rollback): when the same-sign mean exceeds its budget, `∂ log ρ_s / ∂ l_t = δ_st - (1+κ)/n±`
      for the in-band tokens `t` of that sign, so the summed update of those tokens is reversed with slope `-κ`
      (restorative) while their relative (fibre) directions are untouched.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)` (per token).

    Sources: the paper's abstract (arXiv:2603.08239: base-level gate on trajectory aggregates, fibre-level gate on
    per-token residuals, block-diagonal Jacobian, identity on-policy) and the summary of the JoyAI-LLM Flash report
    (arXiv:2604.03044 §3.3.1, Eq. 1-5) in our notes: `w_base = exp(g_agg(log s+, C+)) / exp(g_agg(log s−, C−))`,
    `r̃ = exp(clip(l·u, ±ε) − clip(l·v, ±ε))`, `ε ≪ C+ + C−`, `C− < C+`; the per-token gate clips each token's
    deviation from its same-sign trajectory mean; the trajectory gate has a rollback zone with negative slope.
    No official code exists and the full text of either paper was not available to us, so the exact `g_agg`,
    the residual definition and all values are ours:
    - Choice: `log s±` are the means of the upward / downward token log-ratios over the tokens of that sign, and
      `r̃` carries the other sign's mean unclipped, so that `w_base · r̃_t` is the token ratio inside the bands.
    - Choice: each token has one residual, against the mean of its own sign; the other-sign coordinate is not
      clipped (clipping it would rescale every token of a trajectory whose other-sign mean exceeds ε).
    - Choice: `g(x, C) = x` below `C`, then slope `-κ` with `κ = 1` (reflection) by default; `κ = 0` is a flat clip.
    - Choice: the trajectory gate is advantage-signed, as PPO's clip: the upward budget `C+` gates trajectories
      with `A > 0`, the downward budget `C−` those with `A < 0`; the other side is left to the objective itself
      (a sign-blind rollback would push a negative-advantage trajectory further up, and vice versa).
    - Choice: a censored token (fibre gate) gets no gradient at all and does not move its siblings' means (the
      catalog's check); full differentiation would give it a share through the base.
    - Choice: `ε = 0.05`, `C+ = 0.28`, `C− = 0.2` (log space; DAPO's clip-higher pair reused as the trajectory
      budgets so that `C− < C+`, and `ε` ≈ a tenth of `C+ + C−`). The paper gives no values.
    - Choice: `l_t = 0` counts as downward (on-policy every token is, with `μ± = 0`). A token crossing 0 changes
      `n±`, so the means (and the gates read from them) jump there; the value `ρ_t` inside both bands does not.
    - Choice: aggregation `sequence_mean` (TRL's GRPO normaliser, so on-policy FiberPO is TRL's GRPO step); KL
      (`beta`, default 0) is added by the trainer. `A = 0` gives 0. The multi-level hierarchy (FiberPO-Domain:
      domain and prompt-group levels) is not implemented.
    """
    logps = ctx.logps
    mask = ctx.mask.to(logps.dtype)
    active = mask > 0
    adv = ctx.advantages
    zero = torch.zeros_like(logps)

    log_ratio = torch.clamp(logps - ctx.old_logps, -TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)
    log_ratio = torch.where(active, log_ratio, zero)  # padding never read
    upward = active & (log_ratio > 0)
    downward = active & ~upward
    up_part = torch.where(upward, log_ratio, zero)  # l·u ≥ 0
    down_part = torch.where(downward, -log_ratio, zero)  # l·v ≥ 0 (magnitude of the downward moves)
    n_up = upward.to(logps.dtype).sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    n_down = downward.to(logps.dtype).sum(-1, keepdim=True).clamp(min=1.0)

    with torch.no_grad():
        mu_up = up_part.sum(-1, keepdim=True) / n_up
        mu_down = down_part.sum(-1, keepdim=True) / n_down
        residual = log_ratio - torch.where(upward, mu_up, -mu_down)  # deviation from the same-sign mean
        in_band = active & (residual.abs() <= fiberpo_epsilon)
        fibre_correction = torch.clamp(residual, -fiberpo_epsilon, fiberpo_epsilon) - residual

    # Same-sign means whose gradient comes from in-band tokens only (censored tokens are constants).
    mu_up_g = torch.where(in_band, up_part, up_part.detach()).sum(-1, keepdim=True) / n_up
    mu_down_g = torch.where(in_band, down_part, down_part.detach()).sum(-1, keepdim=True) / n_down
    k = 1.0 + fiberpo_rollback_slope
    up_excess = torch.relu(mu_up_g - fiberpo_c_pos)  # (B, 1)
    down_excess = torch.relu(mu_down_g - fiberpo_c_neg)
    # g(x, C) - x = -(1 + κ)·relu(x - C); the upward gate for A > 0, the downward gate for A < 0.
    base_correction = torch.where(adv > 0, -k * up_excess, zero) + torch.where(adv < 0, k * down_excess, zero)

    gated = torch.clamp(log_ratio + base_correction + fibre_correction, max=GATED_LOG_RATIO_MAX)
    ratio = torch.exp(gated)
    ratio = torch.where(in_band, ratio, ratio.detach())
    loss = -adv * ratio
    return torch.where(active, loss, zero)
