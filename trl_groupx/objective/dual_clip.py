"""Dual-clip PPO (arXiv:1912.09729), verl's default policy loss: PPO's clip plus a cap on negative-advantage terms."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .surrogates import log_ratio

# verl clamps the log-ratio before exponentiating (core_algos.py l.1338); kept for parity with verl.
LOG_RATIO_CLAMP = 20.0


def _validate(config) -> None:
    if not config.dual_clip_c > 1.0:
        raise ValueError(
            f"dual_clip_c={config.dual_clip_c!r} must be > 1 (it caps the ratio of negative-advantage tokens from "
            "above, beyond PPO's 1 + epsilon_high); verl uses 3.0."
        )


@register(
    "dual_clip",
    name="Dual-clip PPO (verl's vanilla policy loss)",
    paper="Mastering Complex Control in MOBA Games with Deep Reinforcement Learning, arXiv:1912.09729",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="objective",
    flags={"loss_type": "dual_clip", "dual_clip_c": 3.0, "epsilon": 0.2, "loss_aggregation": "global_token_mean"},
    params=("dual_clip_c",),
    validate=_validate,
)
def dual_clip_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    dual_clip_c: float,
    importance_sampling_level: str = "token",
) -> torch.Tensor:
    """Dual-clip PPO surrogate, per token `(B, T)`.

    With `ρ_t = exp(clamp(logp_t - logp_old_t, ±20))`, `ε_low = epsilon`, `ε_high = epsilon_high` (or `epsilon`):

        l¹_t = max(-A_t ρ_t, -A_t clip(ρ_t, 1-ε_low, 1+ε_high))          (PPO's clipped surrogate, as a loss)
        l_t  = min(l¹_t, -A_t c)   if A_t < 0,    l_t = l¹_t   otherwise  (c = dual_clip_c, default 3)

    For `A < 0` and `ρ > c` PPO's loss `-A ρ` grows without bound; dual clip caps it at `-A c` (gradient 0 there),
    so one very off-policy token cannot dominate the update. On-policy (ρ = 1) it equals GRPO's surrogate.

    Convention where TRL and verl differ: this is verl's `vanilla` loss, which verl always applies (TRL never does):
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9, `verl/trainer/ppo/core_algos.py`,
    `compute_policy_loss_vanilla` l.1285-1376 (log-ratio clamp l.1338, cap l.1355-1361; `clip_ratio_c` default 3.0,
    `verl/workers/config/actor.py` l.164). The bounds are TRL's `epsilon`/`epsilon_high` (verl's
    `clip_ratio_low`/`clip_ratio_high`, both 0.2 by default, as the flags set). The default aggregation is
    `global_token_mean`, verl's default `loss_agg_mode="token-mean"` over the global batch (independent of how the
    batch is split for gradient accumulation). `A = 0` takes the `A ≥ 0` branch (loss 0 either way). verl's
    rollout-correction weights correspond to TRL's vLLM importance-sampling correction, applied by the trainer.
    KL (only when `beta != 0`; the flags keep TRL's default 0): the trainer adds TRL's k3, multiplied by the ratio
    when `use_bias_correction_kl` (TRL's default); verl's `use_kl_loss` adds an unweighted k3 clamped to ±10.
    The paper (Ye et al. 2020, §3) states the same cap `max(min(ρA, clip(ρ)A), cA)` for `A < 0`.

    Ratio level: `importance_sampling_level="token"` (verl's, the default) or `"turn"`: `ρ_t` is then the ratio of
    token t's assistant turn, one length-normalised ratio per turn shared by its tokens (GAGPO's action-level ratio,
    `trl_groupx.objective.turn_ratio`), clamped, clipped and capped as above.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(torch.clamp(log_ratio(ctx, importance_sampling_level), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = ctx.advantages
    clipped_loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - epsilon, 1 + eps_high))
    return torch.where(adv < 0, torch.minimum(clipped_loss, -adv * dual_clip_c), clipped_loss)
