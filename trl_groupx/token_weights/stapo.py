"""STAPO: silence spurious tokens (low probability, low entropy, positive advantage) and renormalise the loss."""

from __future__ import annotations

import math

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, check_renormalization, clean_advantages, reject_sequence_averaging_objective


def _validate(config) -> None:
    if not 0.0 < config.stapo_prob_threshold <= 1.0:
        raise ValueError(f"stapo_prob_threshold must lie in (0, 1], got {config.stapo_prob_threshold!r}.")
    if not 0.0 <= config.stapo_entropy_quantile <= 1.0:
        raise ValueError(f"stapo_entropy_quantile must lie in [0, 1], got {config.stapo_entropy_quantile!r}.")
    reject_sequence_averaging_objective("stapo", config)
    check_renormalization(config, "stapo_renormalize")


def spurious_mask(
    advantages: torch.Tensor, logps: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor,
    prob_threshold: float, entropy_quantile: float,
) -> torch.Tensor:
    """`(N, T)` bool: positive-advantage tokens with `p < τ_p` and entropy below the q-quantile of such tokens."""
    positive = advantages > 0
    if positive.dim() == 1:
        positive = positive[:, None].expand_as(mask)
    low_prob = mask & positive & (logps < math.log(prob_threshold))
    if not low_prob.any():
        return low_prob
    return low_prob & (entropies < _quantile(entropies[low_prob], entropy_quantile))


def _quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """Linear-interpolation quantile (numpy's default, = `torch.quantile`) without `torch.quantile`'s size cap."""
    ordered = values.sort().values
    pos = q * (ordered.numel() - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@register(
    "stapo",
    name="STAPO (Spurious-Token-Aware Policy Optimization)",
    paper="STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens, arXiv:2602.15620",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "stapo", "stapo_prob_threshold": 0.002, "stapo_entropy_quantile": 0.75,
           "stapo_renormalize": "token", "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0},
    requires=("entropies", "old_logps"),
    params=("stapo_prob_threshold", "stapo_entropy_quantile", "stapo_renormalize"),
    validate=_validate,
)
def stapo_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    stapo_prob_threshold: float,
    stapo_entropy_quantile: float,
    stapo_renormalize: str,
) -> torch.Tensor:
    r"""STAPO's S2T mechanism: zero the advantage of spurious tokens and renormalise over the remaining ones.

    A token `(i, t)` of a real completion is spurious when, under the rollout policy,

        A_i > 0   and   π(y_t) < τ_p   and   H_t < τ_H,   τ_H = Quantile_q({H_s : A > 0, π(y_s) < τ_p}),

    the quantile being taken over all such tokens of the generation batch (linear interpolation, as
    `torch.quantile`/numpy). Then `A'_it = c · A_i · (1 − spurious_it)` on real tokens, 0 on padding, with the
    renormalisation `c` (`stapo_renormalize`):
    - `"token"`: `c = Σ m / (Σ m − #spurious)` over the batch, which turns a global token-mean loss
      (`loss_type="dapo"`/`"cispo"`, the paper's DAPO-style token-level objective) into the mean over the valid
      tokens only — the masked tokens leave the denominator;
    - `"sequence"`: per completion `c_i = L_i / (L_i − #spurious_i)`, the same for `sequence_mean` losses (GRPO);
    - `"none"`: mask only (spurious tokens still count in the denominator).
    Every surrogate that is linear in a positive rescaling of the token advantage (TRL's clipped surrogates, CISPO)
    then equals the renormalised masked loss exactly. `validate` rejects a mode that does not match the loss's
    normaliser. With `beta != 0` the KL term is not renormalised (the paper uses no KL). Objectives that first
    average the token advantages over a completion (GMPO) would undo the mask and are rejected.

    Shapes: `advantages` `(N,)` (or `(N, T)` from an earlier token stage), `ctx.logps`, `ctx.entropies`,
    `ctx.completion_mask` `(N, T)`; returns `(N, T)`.

    Citation: Liu et al., arXiv:2602.15620 (no public code); settings from the paper's TeX copy as recorded in
    `official-code.md`: τ_p = 0.002, q = 75 %, clip 0.8/1.28, no KL. Choices where the text is not explicit:
    - probabilities and entropies are the rollout policy's (the trainer's extra no-grad pass); in the paper's
      on-policy setting they equal the current policy's at the first update;
    - strict inequalities (`<`) for both thresholds, as the paper writes them; a single low-probability token is
      therefore never masked (it equals its own quantile);
    - the quantile is over the whole generation batch; unscored rollouts (NaN reward) have advantage 0 and never
      qualify; padding never enters the quantile.
    """
    if ctx.logps is None or ctx.entropies is None:
        raise ValueError("token_weighting='stapo' needs rollout log-probs and entropies in the TokenContext.")
    check_groups(advantages.shape[0], ctx.group_size)
    if advantages.dim() == 1:
        adv = clean_advantages("stapo", advantages, ctx.rewards)[:, None]
    else:
        adv = clean_advantages("stapo", advantages.reshape(-1), None).view_as(advantages)
        if ctx.rewards is not None:
            adv = torch.where(torch.isnan(ctx.rewards)[:, None], torch.zeros_like(adv), adv)
    mask = ctx.completion_mask.bool()
    adv = adv.expand(mask.shape) if adv.shape[1] == 1 else adv
    spurious = spurious_mask(
        adv, ctx.logps.detach().float(), ctx.entropies.detach().float(), mask,
        stapo_prob_threshold, stapo_entropy_quantile,
    )
    valid = mask & ~spurious
    out = torch.where(valid, adv, torch.zeros_like(adv))
    if stapo_renormalize == "token":
        out = out * (mask.sum() / valid.sum().clamp(min=1)).to(out.dtype)
    elif stapo_renormalize == "sequence":
        out = out * (mask.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)).to(out.dtype)
    return out
