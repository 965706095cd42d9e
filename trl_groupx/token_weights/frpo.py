"""FRPO: future-KL correction of GRPO advantages, a reverse cumulative sum of per-token log-ratios."""

from __future__ import annotations

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import clean_advantages


def _validate(config) -> None:
    if config.frpo_beta < 0:
        raise ValueError(f"frpo_beta must be >= 0 (the KL coefficient β), got {config.frpo_beta}.")


@register(
    "frpo",
    name="FRPO (Future-KL Regularized Policy Optimization)",
    paper="FRPO: Future-KL Regularized Policy Optimization (GRPO with token-wise f-divergence), seed abstract "
    "004_65d2611f32946cb1.txt ¶25; official code ScaleML/KL-in-LLM-RL is cited by the paper but not retrievable, "
    "https://github.com/ScaleML/KL-in-LLM-RL",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "frpo", "frpo_beta": 0.01, "beta": 0.0},
    requires=("old_logps", "ref_logps"),
    params=("frpo_beta",),
    validate=_validate,
)
def frpo_token_advantages(advantages: torch.Tensor, ctx: TokenContext, *, frpo_beta: float) -> torch.Tensor:
    r"""FRPO: add the future-KL return-to-go to the standardised GRPO advantage, instead of a loss-side KL.

        A_{i,t} = sg( A_i − β · Σ_{j ≥ t} m_{i,j} (log π_old(y_{i,j}) − log π_ref(y_{i,j})) )

    The reverse cumulative sum runs over the completion's own tokens from position `t` to its end, the current token
    included; `log π_old − log π_ref` is the signed k1 estimate of the reverse KL on the sampled token, from the
    rollout policy (no extra pass beyond the reference's). With this correction the loss carries no KL term
    (`beta = 0`): the paper derives it as the policy-gradient signal of a token-wise reverse-KL regulariser that a
    loss-side KL misses.

    Shapes: `advantages` `(N,)`, `ctx.logps`, `ctx.ref_logps`, `ctx.completion_mask` `(N, T)`; returns `(N, T)`,
    0 on padding. Catalog check: log-ratios [0.1, 0.2, 0.3] with β = 1 give corrections [−0.6, −0.5, −0.3].

    Citation: seed abstract (¶25 of 004_65d2611f32946cb1.txt) and ../shared/official-code.md (paper Eq. 5.1 /
    Alg. 1: k1 estimate, β = 0.01, G = 5, no loss-side KL, current token included). The official code
    (ScaleML/KL-in-LLM-RL) is cited by the paper but was not retrievable. Choices: the reference is TRL's (the
    base model with the adapter disabled under LoRA with `beta = 0`; with full fine-tuning set `beta > 0`, which
    also adds TRL's loss-side KL — the trainer refuses full fine-tuning with `beta = 0`, which has no reference);
    unscored rollouts (NaN reward) get 0 everywhere.
    """
    if ctx.logps is None or ctx.ref_logps is None:
        raise ValueError("token_weighting='frpo' needs rollout and reference log-probs in the TokenContext.")
    adv = clean_advantages("frpo", advantages, ctx.rewards)
    mask = ctx.completion_mask.to(ctx.logps.dtype)
    log_ratio = torch.nan_to_num((ctx.logps - ctx.ref_logps).detach()) * mask  # padding never enters the sum
    future_kl = log_ratio.flip(-1).cumsum(-1).flip(-1)  # Σ_{j ≥ t}
    out = (adv[:, None] - frpo_beta * future_kl) * mask
    if ctx.rewards is not None:
        out = out.masked_fill(torch.isnan(ctx.rewards)[:, None], 0.0)
    return out
