"""HölderPO: sequence-level PPO on the Hölder (power) mean of token ratios, with an annealed power p
(arXiv:2605.12058)."""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register

# Below this |p| the power mean is replaced by its p → 0 limit, the geometric mean (official threshold).
GEOMETRIC_THRESHOLD = 1e-6
HOLDERPO_SCHEDULES = ("linear", "constant")


def holderpo_p(global_step: int, *, p_start: float, p_end: float, schedule_steps: int, schedule: str = "linear"
               ) -> float:
    """The power `p` at optimizer step `global_step`: `p_start + (p_end − p_start) · min(1, step / schedule_steps)`
    for `schedule="linear"` (held at `p_end` after the schedule), `p_start` at every step for `"constant"`.

    Official code: `ZeroMathLearner._get_current_holder_p` ("linear_dec": `p_max − (p_max − p_min)·progress`,
    `progress = min(1, step / max(1, steps))`, step clamped at 0), with `p_max = 2`, `p_min = −2`, 500 steps in
    `scripts/qwen2.5-math-7b-holder.sh`; `p_start`/`p_end` name the two ends whichever way the schedule runs.
    """
    if schedule == "constant" or p_start == p_end:
        return float(p_start)
    progress = min(1.0, max(0, int(global_step)) / max(1, int(schedule_steps)))
    return float(p_start + (p_end - p_start) * progress)


def holder_log_mean(log_ratio: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """`log M_p` per row `(B, 1)` of the ratios `exp(log_ratio)` over the positions where `mask` is 1:
    `log M_p = (1/p) log((1/|y|) Σ_t exp(p·d_t))`, computed shifted by the row maximum with `expm1`/`log1p` (no
    overflow of `ρ^p`, float32-accurate as `p → 0`), and the mean log-ratio when `|p| < 1e-6`. Rows with no token
    get 0 (`M = 1`). Padding values are never read."""
    on = mask.bool()
    length = mask.sum(-1, keepdim=True)
    nonempty = length > 0
    d = torch.where(on, log_ratio, torch.zeros_like(log_ratio))
    if abs(p) < GEOMETRIC_THRESHOLD:
        log_m = d.sum(-1, keepdim=True) / length.clamp(min=1.0)
    else:
        # log mean_t exp(z_t) = c + log1p(mean_t expm1(z_t − c)), c = max_t z_t (detached: the value does not
        # depend on it): no overflow for large p·d, and no cancellation for small p (both terms are O(p)).
        z = p * d
        c = torch.where(on, z, torch.full_like(z, -math.inf)).amax(-1, keepdim=True).detach()
        c = torch.where(nonempty, c, torch.zeros_like(c))
        s = torch.where(on, torch.expm1(z - c), torch.zeros_like(z)).sum(-1, keepdim=True) / length.clamp(min=1.0)
        log_m = (c + torch.log1p(s)) / p
    return torch.where(nonempty, log_m, torch.zeros_like(log_m))


def _validate(config) -> None:
    if config.holderpo_schedule not in HOLDERPO_SCHEDULES:
        raise ValueError(f"holderpo_schedule={config.holderpo_schedule!r} must be one of {HOLDERPO_SCHEDULES}.")
    for name in ("holderpo_p_start", "holderpo_p_end"):
        value = getattr(config, name)
        if not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be a finite number (paper range: −2 … 2).")
    if config.holderpo_schedule == "linear" and not (isinstance(config.holderpo_schedule_steps, int)
                                                     and config.holderpo_schedule_steps >= 1):
        raise ValueError(
            f"holderpo_schedule_steps={config.holderpo_schedule_steps!r} must be an integer ≥ 1 (paper: 500); use "
            "holderpo_schedule='constant' for a fixed p."
        )
    if not 0 < config.epsilon < 1:
        raise ValueError(f"loss_type='holderpo' clips the sequence ratio to [1 − epsilon, 1 + epsilon_high]: "
                         f"epsilon={config.epsilon!r} must be in (0, 1) (paper: 0.2).")


@register(
    "holderpo",
    name="HölderPO (Hölder-mean Policy Optimization)",
    paper="Hölder Policy Optimisation, arXiv:2605.12058",
    official_code="YihangChen9/HolderPO@1d27a3778cbc47144e88c95e3cbac6318fb06ee2:train_zero_math_holder.py",
    stage="objective",
    flags={"loss_type": "holderpo", "holderpo_p_start": 2.0, "holderpo_p_end": -2.0, "holderpo_schedule_steps": 500,
           "holderpo_schedule": "linear", "epsilon": 0.2, "loss_aggregation": "sequence_mean", "beta": 0.0},
    params=("holderpo_p_start", "holderpo_p_end", "holderpo_schedule_steps", "holderpo_schedule"),
    requires=("global_step",),
    validate=_validate,
)
def holderpo_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    holderpo_p_start: float,
    holderpo_p_end: float,
    holderpo_schedule_steps: int,
    holderpo_schedule: str,
    global_step: int,
    total_steps: int,
) -> torch.Tensor:
    """HölderPO: PPO's clipped surrogate on one ratio per sequence, the Hölder (power) mean of its token ratios.

    Per sequence `i` with token ratios `ρ_t = exp(logp_t − logp_old_t)` over its `|y_i|` completion tokens and the
    power `p` of the current optimizer step (below):

        M_p,i = ((1/|y_i|) Σ_t ρ_t^p)^{1/p}           (|p| ≥ 1e-6);   M_0,i = exp((1/|y_i|) Σ_t log ρ_t)   (|p| < 1e-6)
        ℓ_i   = max(−A_i M_p,i, −A_i clip(M_p,i, 1 − ε_low, 1 + ε_high))

    with `ε_low = epsilon`, `ε_high = epsilon_high or epsilon` (official: 0.2 both), no per-token clip.
    `ℓ_i` is broadcast to `(B, T)`; with `loss_aggregation="sequence_mean"` (the default) the loss is `mean_i ℓ_i`,
    the official reduction (`(pg_loss_max * loss_masks).mean()`, one sequence per micro-batch). Special cases:
    `p = 1` is the arithmetic mean of the ratios (GRPO's per-sequence token mean of `−A ρ_t` wherever neither clip
    is active; GRPO clips token by token, HölderPO only the mean); `p → 0` is GMPO's geometric mean (without GMPO's
    per-token log-space clip); `p = −1` the harmonic mean. Larger `p` leans on the largest ratios of a sequence,
    smaller `p` on the smallest. The gradient on token `t` of an unclipped sequence is
    `−A_i M^{1−p} ρ_t^p / |y_i|`; on-policy (all `ρ = 1`) it is `−A_i / |y_i|` for every `p`, as GRPO's.

    Schedule (`global_step`, supplied by the trainer: optimizer steps done): `p` goes linearly from
    `holderpo_p_start` (2) to `holderpo_p_end` (−2) over `holderpo_schedule_steps` (500) steps and stays at the end
    value afterwards; `holderpo_schedule="constant"` keeps `p = holderpo_p_start` (see `holderpo_p`).

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)` (token
    advantages are averaged over the completion first, as `gmpo` does). Returns `(B, T)`.

    Official code: YihangChen9/HolderPO@1d27a3778cbc47144e88c95e3cbac6318fb06ee2, `train_zero_math_holder.py`,
    `ZeroMathLearner.learning_step`, branch `critic_type_modify == "holder"` (ratio = `(Σ_t mask·exp(p·Δ_t) /
    (|y| + 1e-8))^{1/p}`, geometric mean when `abs(p) < 1e-6`, `max(−A·ratio, −A·clamp(ratio, 1 − cliprange,
    1 + cliprange))`, mean over the micro-batch), and `ZeroMathLearner._get_current_holder_p` (schedules);
    `scripts/qwen2.5-math-7b-holder.sh` (`linear_dec`, p 2 → −2, 500 steps, cliprange 0.2, G = 8, beta 0, lr 1e-6,
    GRPO mean/std advantages). Line numbers are not given: the repository could be read only through a text index
    here, not fetched as a git snapshot.

    Choices: the power mean is computed in log space (shifted, `expm1`/`log1p`; see `holder_log_mean`), equal to
    the official `exp(p·Δ)` sum where that neither overflows nor loses precision for small `|p|` (the official
    float32 form has a relative error of order `1e-7/|p|` just above the 1e-6 threshold); an empty completion
    (`|y| = 0`) gets `M = 1` and no gradient (the official code gives `0^{1/p}`: 0 or ∞). `p` is read from the
    optimizer step (`global_step`); the official schedule reads oat's learner counter `self.steps`, which (as far as
    we could read oat's learner loop, not fetched here) counts rollout batches, each possibly trained with several
    optimizer steps (1024 rollouts per batch, `train_batch_size` 128). The two counts agree when one generation
    batch gives one optimizer step (`steps_per_generation = gradient_accumulation_steps`, `num_iterations = 1`, as in
    `recipes/holderpo.yaml`); otherwise scale `holderpo_schedule_steps`. `total_steps` is not used (the schedule has
    its own length, as in the official code). The advantages' std epsilon is the advantage stage's (TRL 1e-4;
    official 1e-8).
    """
    del total_steps  # the schedule has its own length (holderpo_schedule_steps), as in the official code
    p = holderpo_p(global_step, p_start=holderpo_p_start, p_end=holderpo_p_end,
                   schedule_steps=holderpo_schedule_steps, schedule=holderpo_schedule)
    mask = ctx.mask
    adv = ctx.advantages
    if adv.shape[-1] != 1:
        adv = (adv * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp(holder_log_mean(ctx.logps - ctx.old_logps, mask, p))  # (B, 1)
    high = epsilon_high if epsilon_high is not None else epsilon
    loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - epsilon, 1.0 + high))
    return loss.expand_as(ctx.logps)
