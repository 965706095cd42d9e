"""Advantage Reweighting (AR) of "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs"."""

from __future__ import annotations

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, clean_advantages

_OFFICIAL = "zhyang2226/AR-Lopti@cbeb333376decdfe571fa8613bdebcfcc526628d:verl/trainer/ppo/ray_trainer.py"


def _validate(config) -> None:
    if not 0.0 <= config.lopti_alpha <= 1.0:
        raise ValueError(
            f"lopti_alpha must lie in [0, 1] (the token weight is α·p + 1 − α; 0 = GRPO), got {config.lopti_alpha!r}."
        )


@register(
    "lopti",
    name="Advantage Reweighting (AR; Lopti's two-phase update not included)",
    paper="Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs, arXiv:2505.12929",
    official_code=_OFFICIAL,
    stage="token_weights",
    flags={"token_weighting": "lopti", "lopti_alpha": 0.3, "loss_type": "dapo", "epsilon": 0.2,
           "epsilon_high": 0.24, "beta": 0.001},
    requires=("old_logps",),
    params=("lopti_alpha",),
    validate=_validate,
)
def lopti_token_advantages(advantages: torch.Tensor, ctx: TokenContext, *, lopti_alpha: float) -> torch.Tensor:
    r"""Advantage Reweighting: `A'_{i,t} = (α · π_old(y_{i,t}) + 1 − α) · A_i` on real tokens, 0 on padding.

    `π_old(y_{i,t}) = exp(ctx.logps)` is the rollout policy's probability of the sampled token (the trainer's
    extra no-grad pass, detached). High-probability tokens keep (almost) their full advantage, low-probability
    tokens get at least `1 − α` of it, which damps the gradient share of low-probability tokens; the same factor
    applies to positive and negative advantages. `α = 0` gives the incoming advantages back (GRPO).

    Shapes: `advantages` `(N,)` (or `(N, T)`), `ctx.logps`/`ctx.completion_mask` `(N, T)`; returns `(N, T)`.

    Official code: `zhyang2226/AR-Lopti@cbeb333376decdfe571fa8613bdebcfcc526628d`,
    `verl/trainer/ppo/ray_trainer.py:compute_reweight_advantage` l.318-404, branch `both_linear` + `normal`
    (`(reweight_k · exp(old_log_prob) + reweight_tau) · advantage`, negatives × `neg_adv_weight` = 1), called at
    l.1187-1194 after the GRPO advantage. The scripts set `reweight_k = α`, `reweight_tau = 1 − α`; we expose
    α only (`lopti_alpha`), so the weights always interpolate between 1 − α and 1. α = 0.3 is the AR+Lopti script
    (`scripts/train_kklogic_AR-Lopti_4x80GB.sh`); the AR-only script uses α = 0.2.
    Other reweighting branches of that function (sigmoid, probability-interval masks, RAFT) are ablations and are
    not exposed.

    Not included — Lopti (Low-Probability Token Isolation, l.1264-1293): the official update calls `update_actor`
    twice per batch with the same old log-probs, first with the advantages of tokens with `π_old < η` (η = 0.5)
    only, then with the others. That is a change to the optimisation loop (two optimizer phases per rollout
    batch), not a token weight: it cannot be expressed in this stage, and a single-phase approximation would not
    be Lopti, so we leave it out (the catalog's 2-sub-step check belongs to a future loss/optimizer hook).

    Edge cases: unscored rollouts (NaN reward or advantage) get 0; all-equal groups keep their 0 advantages;
    padding (any junk log-prob there) is never read into a real token's value.
    """
    if ctx.logps is None:
        raise ValueError("token_weighting='lopti' needs rollout log-probs in the TokenContext.")
    check_groups(advantages.shape[0], ctx.group_size)
    mask = ctx.completion_mask.bool()
    if advantages.dim() == 1:
        adv = clean_advantages("lopti", advantages, ctx.rewards)[:, None].expand(mask.shape)
    else:
        adv = clean_advantages("lopti", advantages.reshape(-1), None).view_as(advantages)
        if ctx.rewards is not None:
            adv = torch.where(torch.isnan(ctx.rewards)[:, None], torch.zeros_like(adv), adv)
    probs = torch.where(mask, ctx.logps.detach().float(), torch.zeros_like(adv)).exp()
    out = (lopti_alpha * probs + (1.0 - lopti_alpha)) * adv
    return torch.where(mask, out, torch.zeros_like(out))
