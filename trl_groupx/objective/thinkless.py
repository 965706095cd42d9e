"""Thinkless / DeGRPO (arXiv:2505.13379): the control token's loss decoupled from the response loss."""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register

# The normalisations this objective reproduces, keyed by the aggregation the trainer applies after it.
THINKLESS_AGGREGATIONS = ("sequence_mean", "token_mean")


def _validate(config) -> None:
    alpha = config.thinkless_alpha
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(
            f"thinkless_alpha={alpha!r} must be a finite weight >= 0 on the control-token loss (official: 0.001)."
        )
    if config.loss_aggregation not in (None, *THINKLESS_AGGREGATIONS):
        raise ValueError(
            f"loss_type='thinkless' normalises the control token and the response itself and supports "
            f"loss_aggregation in {THINKLESS_AGGREGATIONS} (None = 'sequence_mean', the paper's per-sequence form; "
            f"'token_mean' = the official code's per-micro-batch form), got {config.loss_aggregation!r}."
        )


@register(
    "thinkless",
    name="Thinkless (DeGRPO, Decoupled GRPO)",
    paper="Thinkless: LLM Learns When to Think, arXiv:2505.13379",
    official_code="VainF/Thinkless@aa225d2a2bff8b473661dae8d9e27ce20059693a:verl/verl/trainer/ppo/core_algos.py",
    stage="objective",
    flags={
        "loss_type": "thinkless",
        "thinkless_alpha": 0.001,
        "loss_aggregation": "sequence_mean",
        "scale_rewards": "none",
        "epsilon": 0.2,
        "beta": 0.001,
        "temperature": 0.6,
    },
    params=("thinkless_alpha",),
    validate=_validate,
)
def thinkless_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    thinkless_alpha: float,
    loss_aggregation: str | None,
) -> torch.Tensor:
    """DeGRPO per-token loss `(B, T)`: PPO's clipped token loss, re-weighted so that the control token (completion
    position 0, `<think>`/`<short>` after the warm-up SFT) and the response (positions ≥ 1) are normalised apart.

    With `ρ_t = exp(logp_t - logp_old_t)` and `ℓ_t = max(-A_t ρ_t, -A_t clip(ρ_t, 1-ε_low, 1+ε_high))` (`ε_low =
    epsilon`, `ε_high = epsilon_high` or `epsilon`), control mask `c_i = m_{i,0}`, response mask `r_{i,t} = m_{i,t}`
    for `t ≥ 1` (0 at `t = 0`), `n_i = Σ_t m_{i,t}`, `|y_i| = Σ_t r_{i,t}`:

    - `loss_aggregation="sequence_mean"` (default, the paper's DeGRPO objective `(1/G) Σ_i [α ℓ_{i,0} + (1/|y_i|)
      Σ_{t≥1} ℓ_{i,t}]` — as transcribed by a third-party summary of arXiv:2505.13379; the paper text itself was not
      available to us — and the catalog's check "control token weight α, each response token 1/|y|"):

          l_{i,0} = α ℓ_{i,0} n_i,     l_{i,t} = ℓ_{i,t} n_i / |y_i|   (t ≥ 1)

      so that the trainer's `mean_i (1/n_i) Σ_t l_{i,t} m_{i,t}` is exactly the paper's objective. Every weight is a
      per-row quantity: the loss does not depend on how the batch is split for gradient accumulation.
    - `loss_aggregation="token_mean"` (the official code, exactly, per micro-batch): with `M = Σ_{i,t} m`, `C = Σ_i c_i`,
      `R = Σ_{i,t} r` over the micro-batch,

          l_{i,0} = α ℓ_{i,0} M / C,     l_{i,t} = ℓ_{i,t} M / R

      so the trainer's `Σ l m / M` is `α·(1/C) Σ_i ℓ_{i,0} + (1/R) Σ_{i,t≥1} ℓ_{i,t}`: official
      `pg_loss = thinkless_alpha * masked_mean(token_loss, cond_mask) + masked_mean(token_loss, resp_mask)`, then
      divided by the accumulation steps as the official actor does. Like the official code this depends on the
      micro-batch split (the counts `C`, `R` are the micro-batch's); the split-invariant form would need the window's
      global counts, which the trainer does not hand to objectives (see "Not split-invariant" below).

    A row whose position 0 is masked has no control term (official: `cond_mask = eos_mask[:, :1]`); a row with only the
    control token has no response term; an empty micro-batch class contributes 0 (the official `masked_mean` would be
    0/0). `α = 0` leaves the response term alone, which is GRPO's surrogate (sequence mean) on the response tokens, or
    BNPO's token mean under `token_mean` (the catalog's "removing the control token → GRPO").

    Official code: VainF/Thinkless@aa225d2a2bff8b473661dae8d9e27ce20059693a,
    `verl/verl/trainer/ppo/core_algos.py`, `compute_policy_loss` l.168-215 (`thinkless_alpha` branch l.200-212:
    `cond_mask[:, 1:] = 0`, `resp_mask[:, 0] = 0`, `verl_F.masked_mean` of each, `thinkless_alpha * cond_loss +
    resp_loss`); `verl/verl/workers/actor/dp_actor.py` l.249-273 (KL `low_var_kl` token-mean over all response tokens
    incl. the control token, `loss = policy_loss / self.gradient_accumulation`); script
    `scripts/rl/thinkless_1.5b_deepscaler.sh` (`thinkless_alpha=0.001`, `std_normalizer=False` i.e. Dr. GRPO
    advantages `r - mean(r)`, `kl_loss_coef=0.001`, temperature 0.6, n=8, rewards: correct short 1.0, correct
    think 0.5, wrong −1.0).
    Mapping and choices:
    - Paper vs code: the official code's response term is a per-token mean over the micro-batch and its control term
      a per-sequence mean (official-code notes, Thinkless); the paper writes a per-sequence `1/|y_i|` response mean.
      The paper wins by default (`sequence_mean`); `token_mean` reproduces the code.
    - PPO clip: the official clip is symmetric (`cliprange`, verl's 0.2), without dual clip or log-ratio clamp; we use
      TRL's `epsilon` / `epsilon_high` (None = symmetric, as the flags set).
    - The control-token identity (that position 0 is `<think>` or `<short>`) is not checked here: the objective
      does not receive the completion ids. The official code does not check it either (position 0 is assumed to be
      the control token, guaranteed by the warm-up SFT); rewards should score a missing control token as wrong.
    - KL (`beta`, official 0.001, `low_var_kl` = k3 clamped to ±10): added by the trainer per token (TRL's k3, or
      `kl_estimator`) and normalised by the same aggregation; under `sequence_mean` it is GRPO's per-sequence mean,
      under `token_mean` the official token mean. The official entropy bonus (verl's default 0.001) is not
      reproduced (the trainer rejects TRL's entropy bonus for its objectives).
    - Dr. GRPO advantages: `scale_rewards="none"` (TRL), set by the flags; the reward (1 / 0.5 / −1) is the user's.

    Not split-invariant under `token_mean`: the exact window-level form `α/C_win Σ ℓ_{i,0} + 1/R_win Σ ℓ_{i,t}` needs
    the counts `C_win`, `R_win` of the accumulation window (as the trainer computes `num_items_in_batch` for
    `global_token_mean`); passing those two counts in the `ObjectiveContext` would make it exact and split-invariant.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`.
    """
    aggregation = loss_aggregation or "sequence_mean"
    if aggregation not in THINKLESS_AGGREGATIONS:
        raise ValueError(f"loss_type='thinkless' supports loss_aggregation in {THINKLESS_AGGREGATIONS}, got {aggregation!r}.")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    mask = ctx.mask.to(ctx.logps.dtype)
    # padding never reaches the loss nor its gradient (a masked log-ratio could overflow exp)
    ratio = torch.exp(torch.where(mask > 0, ctx.logps - ctx.old_logps, torch.zeros_like(ctx.logps)))
    adv = ctx.advantages
    token_loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - epsilon, 1 + eps_high))
    control = torch.zeros_like(mask)
    control[:, :1] = mask[:, :1]
    response = mask - control
    if aggregation == "sequence_mean":
        n = mask.sum(-1, keepdim=True)
        y = response.sum(-1, keepdim=True)
        control_w = thinkless_alpha * n
        response_w = n / y.clamp(min=1.0)
    else:
        total = mask.sum()
        control_w = thinkless_alpha * total / control.sum().clamp(min=1.0)
        response_w = total / response.sum().clamp(min=1.0)
    weight = control * control_w + response * response_w
    return torch.where(mask > 0, token_loss * weight, torch.zeros_like(token_loss))
