"""D³S token level: keep the tokens with the largest |A|·H, with a curriculum keep ratio (arXiv abstract only)."""

from __future__ import annotations

import math

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, check_renormalization, clean_advantages, reject_sequence_averaging_objective

_SCHEDULES = ("linear", "cosine", "constant")


def _validate(config) -> None:
    for name in ("d3s_token_keep_start", "d3s_token_keep_end"):
        value = getattr(config, name)
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name} must lie in (0, 1] (fraction of real tokens kept), got {value!r}.")
    if config.d3s_token_schedule not in _SCHEDULES:
        raise ValueError(f"d3s_token_schedule must be one of {_SCHEDULES}, got {config.d3s_token_schedule!r}.")
    reject_sequence_averaging_objective("d3s_token", config)
    check_renormalization(config, "d3s_token_renormalize")
    if config.d3s_token_keep_end < config.d3s_token_keep_start:
        raise ValueError(
            f"d3s_token_keep_end ({config.d3s_token_keep_end}) must be >= d3s_token_keep_start "
            f"({config.d3s_token_keep_start}): the D³S schedule starts aggressive and relaxes."
        )


def keep_ratio(start: float, end: float, schedule: str, global_step: int, total_steps: int) -> float:
    """ρ(step): `start` at step 0 → `end` at the last step (`constant`: always `start`)."""
    if schedule == "constant":
        return start
    progress = min(max(global_step / total_steps, 0.0), 1.0) if total_steps > 0 else 0.0
    if schedule == "cosine":
        progress = 0.5 * (1.0 - math.cos(math.pi * progress))
    return start + (end - start) * progress


@register(
    "d3s_token",
    name="D³S token level (|A|·H token down-sampling with a curriculum keep ratio)",
    paper="Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient Policy "
    "Optimization, arXiv:2509.22115",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "d3s_token", "d3s_token_keep_start": 0.5, "d3s_token_keep_end": 1.0,
           "d3s_token_schedule": "linear", "d3s_token_renormalize": "token", "loss_type": "dapo"},
    requires=("entropies", "global_step"),
    params=("d3s_token_keep_start", "d3s_token_keep_end", "d3s_token_schedule", "d3s_token_renormalize"),
    validate=_validate,
)
def d3s_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    d3s_token_keep_start: float,
    d3s_token_keep_end: float,
    d3s_token_schedule: str,
    d3s_token_renormalize: str,
    global_step: int = 0,
    total_steps: int = 0,
) -> torch.Tensor:
    r"""D³S token-level down-sampling: keep the top-ρ fraction of tokens by `|A_{i,t}|·H_{i,t}`, zero the rest.

    Score `s_{i,t} = |A_i| · H_{i,t}` (rollout-policy entropy, detached) on the real tokens of the generation batch
    (all groups together: the abstract prioritises tokens "across groups"); keep the `k = ⌈ρ·M⌉` highest-scoring of the `M`
    real tokens (ties broken by position in the batch, row-major — stable sort), then
    `A'_{i,t} = c · A_i · keep_{i,t}`, 0 on padding, with the renormalisation `c` (`d3s_token_renormalize`):
    `"token"` `c = M / k` (dropped tokens leave a global token-mean loss's denominator, `loss_type="dapo"`),
    `"sequence"` `c_i = L_i / k_i` (sequence-mean losses), `"none"` (mask only). ρ = 1 gives the incoming
    advantages back exactly.

    Keep ratio (curriculum: aggressive early, relaxed later):
    `ρ(step) = ρ_start + (ρ_end − ρ_start)·f(step/total_steps)`, `f` linear (`d3s_token_schedule="linear"`) or
    `(1 − cos πx)/2` (`"cosine"`), or `ρ = ρ_start` (`"constant"`); `global_step`/`total_steps` come from the
    trainer (optimizer steps done / planned).

    Shapes: `advantages` `(N,)`, `ctx.entropies`/`ctx.completion_mask` `(N, T)`; returns `(N, T)`.

    Registered as `d3s_token` because the catalog id `d3s` is the sample level (`rollout_filter="d3s"`,
    `trl_groupx/sampling/d3s.py`); both can be switched on together (the full D³S). Same schedule semantics as
    there (`total_steps <= 0`, i.e. unknown, counts as step 0), separate fields.

    Citation: Wang et al., arXiv:2509.22115 (D³S); no public code (the paper's code is in its supplementary
    material, not available here) and only the abstract could be read. What the abstract fixes: the token score
    `|A_{i,t}|·H_{i,t}` and a curriculum schedule that starts aggressive and relaxes. Everything else is our
    choice and a parameter: the schedule's shape and end points (defaults ρ 0.5 → 1.0 linear over training, not
    the paper's numbers, which are unknown), selection over the whole batch, ⌈·⌉ rounding, stable tie-breaking,
    and renormalising the loss over the kept tokens. The sample level of D³S (keep the rollout subset that
    maximises Var(A)) is a sampling-stage change and is not part of this variant.
    Edge cases: unscored rollouts (NaN reward) have A = 0, score 0 and get 0; all-equal groups have A = 0 (score
    0, ranked last); empty completions have no tokens; G plays no role beyond the incoming advantages.
    """
    if ctx.entropies is None:
        raise ValueError("token_weighting='d3s_token' needs rollout entropies in the TokenContext.")
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("d3s_token", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    token_adv = adv[:, None].expand(mask.shape)
    rho = keep_ratio(d3s_token_keep_start, d3s_token_keep_end, d3s_token_schedule, global_step, total_steps)
    real = int(mask.sum())
    k = min(real, math.ceil(rho * real - 1e-9))
    if k >= real:
        return torch.where(mask, token_adv, torch.zeros_like(token_adv))
    entropies = torch.where(mask, ctx.entropies.detach().float(), torch.zeros_like(token_adv))
    score = torch.where(mask, token_adv.abs() * entropies.clamp(min=0.0), torch.full_like(token_adv, -1.0))
    order = torch.sort(score.reshape(-1), descending=True, stable=True).indices[:k]
    keep = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    keep[order] = True
    keep = keep.view_as(mask) & mask
    out = torch.where(keep, token_adv, torch.zeros_like(token_adv))
    if d3s_token_renormalize == "token":
        out = out * (mask.sum() / keep.sum().clamp(min=1)).to(out.dtype)
    elif d3s_token_renormalize == "sequence":
        out = out * (mask.sum(-1, keepdim=True) / keep.sum(-1, keepdim=True).clamp(min=1)).to(out.dtype)
    return out
