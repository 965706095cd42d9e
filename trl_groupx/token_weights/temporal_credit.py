"""Temporal credit scheduling (RLVR-Schedule): train only a growing suffix of each completion over training."""

from __future__ import annotations

import math

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, clean_advantages, reject_sequence_averaging_objective

_SCHEDULES = ("linear", "sigmoid", "gamma")


def _validate(config) -> None:
    if not 0.0 <= config.temporal_credit_magnitude < 1.0:
        raise ValueError(
            f"temporal_credit_magnitude must lie in [0, 1) (initial prefix fraction left untrained), "
            f"got {config.temporal_credit_magnitude!r}."
        )
    if not 0.0 < config.temporal_credit_end_fraction <= 1.0:
        raise ValueError(
            f"temporal_credit_end_fraction must lie in (0, 1] (fraction of training after which every token is "
            f"trained), got {config.temporal_credit_end_fraction!r}."
        )
    if config.temporal_credit_schedule not in _SCHEDULES:
        raise ValueError(
            f"temporal_credit_schedule must be one of {_SCHEDULES}, got {config.temporal_credit_schedule!r}."
        )
    if config.temporal_credit_gamma <= 0:
        raise ValueError(f"temporal_credit_gamma must be > 0, got {config.temporal_credit_gamma!r}.")
    reject_sequence_averaging_objective("temporal_credit", config)


def prefix_ratio(magnitude: float, schedule: str, gamma: float, global_step: int, end_step: float) -> float:
    """ρ(step), the untrained prefix fraction (official `_prefix_curriculum`, min_schedule_step = 0).

    progress p = clamp(step / end_step, 0, 1); linear ρ = m(1 − p); gamma ρ = (m(1 − p))^γ;
    sigmoid ρ = m·(σ(p) − σ(1)) / (σ(0) − σ(1)), σ(p) = 1 / (1 + e^{8(p − 0.5)}). `end_step <= 0` (unknown
    training length) counts as step 0.
    """
    progress = min(max(global_step / end_step, 0.0), 1.0) if end_step > 0 else 0.0
    if schedule == "linear":
        return magnitude * (1.0 - progress)
    if schedule == "gamma":
        return (magnitude * (1.0 - progress)) ** gamma
    sig = lambda x: 1.0 / (1.0 + math.exp(8.0 * (x - 0.5)))  # noqa: E731
    return magnitude * (sig(progress) - sig(1.0)) / (sig(0.0) - sig(1.0))


@register(
    "temporal_credit",
    name="Temporal scheduling of credit allocation (RLVR-Schedule, trajectory-position curriculum)",
    paper="Not only where, But when: Temporal Scheduling for RLVR, arXiv:2510.10201 (seed abstract "
    "004_65d2611f32946cb1.txt ¶43, title/arXiv id from the official README)",
    official_code="Jinghaoleven/RLVR-Schedule@f4272efc97b701b20c1366d962cc2cf972ea856e:"
    "verl/experimental/agent_loop/agent_loop.py",
    stage="token_weights",
    flags={"token_weighting": "temporal_credit", "temporal_credit_magnitude": 0.99,
           "temporal_credit_end_fraction": 0.8, "temporal_credit_schedule": "linear"},
    requires=("global_step",),
    params=("temporal_credit_magnitude", "temporal_credit_end_fraction", "temporal_credit_schedule",
            "temporal_credit_gamma"),
    validate=_validate,
)
def temporal_credit_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    temporal_credit_magnitude: float,
    temporal_credit_end_fraction: float,
    temporal_credit_schedule: str,
    temporal_credit_gamma: float = 2.0,
    global_step: int = 0,
    total_steps: int = 0,
) -> torch.Tensor:
    r"""Train only the suffix of each completion; the suffix widens to the whole completion over training.

        ρ(step) = prefix_ratio(...)  (see `prefix_ratio`; linear: ρ = m·(1 − min(step / (f·total_steps), 1)))
        P_i = min(⌊L_i · ρ⌋, L_i − 1)   (untrained prefix length of completion i, L_i its real length)
        A'_{i,t} = A_i if t ≥ P_i else 0;  0 on padding

    So at step 0 with m = 0.99 only the last ⌈0.01·L_i⌉-ish tokens (at least one) carry the advantage; from step
    `f·total_steps` on, ρ = 0 and the output equals GRPO's broadcast advantages exactly. The catalog's
    "trajectory percentile" is token position (../shared/official-code.md).

    Shapes: `advantages` `(N,)`, `ctx.completion_mask` `(N, T)` (right padded); returns `(N, T)`.

    Citation: paper arXiv:2510.10201 (only the abstract read); official code Jinghaoleven/RLVR-Schedule@f4272efc97b701b20c1366d962cc2cf972ea856e,
    verl/experimental/agent_loop/agent_loop.py, `_prefix_curriculum` (l.833-878: linear / sigmoid / gamma
    schedules of `initial_schedule_magnitude`) and the `tp_schedule` branch (l.654-680:
    `prefix_length = min(int(len(response_ids) * prefix_ratio), len(response_ids) - 1)`, the prefix is moved into
    the prompt and only the suffix is a response). Defaults m = 0.99, schedule end = 0.8 of training
    (official-code.md: ρ = 0.99·(1 − prog), s_max = 0.8·T).

    Choices: (1) the official code turns the prefix into prompt (no loss and out of the loss denominator); we keep
    one forward pass and zero the prefix tokens' advantages, so the prefix tokens still count in the loss
    normaliser (token-mean losses are scaled down by the trained fraction; with `beta > 0` TRL's KL still
    applies to them) — the gradient direction of the advantage term equals the official one for
    sequence-local losses up to that scale. (2) `min_schedule_step` is fixed at 0; the end step is
    `temporal_credit_end_fraction · total_steps` (the trainer's planned optimizer steps; unknown → step 0).
    Edge cases: empty completions (L = 0) get nothing; NaN rewards give A = 0 everywhere; all-equal groups give
    A = 0; the group size plays no role beyond the incoming advantages.
    """
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("temporal_credit", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    rho = prefix_ratio(temporal_credit_magnitude, temporal_credit_schedule, temporal_credit_gamma, global_step,
                       temporal_credit_end_fraction * total_steps)
    lengths = mask.sum(-1)
    prefix = torch.minimum(torch.floor(lengths.double() * rho).long(), (lengths - 1).clamp(min=0))
    positions = torch.arange(mask.shape[1], device=mask.device)[None, :]
    keep = mask & (positions >= prefix[:, None])
    return torch.where(keep, adv[:, None].expand(mask.shape), torch.zeros(mask.shape, dtype=adv.dtype,
                                                                            device=adv.device))
