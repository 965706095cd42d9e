"""EDGE-GRPO's Entropy-Driven Advantage (EDA): rescale each completion's advantage by its relative entropy."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, clean_advantages

_OFFICIAL = "ZhangXJ199/EDGE-GRPO@cbe13ca8e21af39f7b4c791bc6226348267dbfb2:trl_edge/trainer/grpo_aha_trainer.py"


def _validate(config) -> None:
    if not config.edge_grpo_eps > 0:
        raise ValueError(
            f"edge_grpo_eps must be > 0 (it guards the division by a mean entropy), got {config.edge_grpo_eps!r}."
        )


@register(
    "edge_grpo",
    name="EDGE-GRPO (Entropy-Driven Advantage)",
    paper="EDGE-GRPO: Entropy-Driven GRPO with Guided Error Correction for Advantage Diversity, arXiv:2507.21848",
    official_code=_OFFICIAL,
    stage="token_weights",
    flags={"token_weighting": "edge_grpo", "edge_grpo_eps": 1e-6, "loss_type": "bnpo", "beta": 0.0,
           # EDGE-GRPO's Guided Error Correction (sampling/edge_grpo_gec.py), a generation-output rewrite flag
           "edge_grpo_gec": True},
    requires=("entropies",),
    needs=("with edge_grpo_gec: answer and solution dataset columns",),
    params=("edge_grpo_eps",),
    validate=_validate,
)
def edge_grpo_token_advantages(advantages: torch.Tensor, ctx: TokenContext, *, edge_grpo_eps: float) -> torch.Tensor:
    r"""EDA: `A'_i = A_i · P̄_g / P_i`, broadcast over the completion's tokens (0 on padding).

    `P_i = (1/|o_i|) Σ_t H_{i,t}` is the mean policy entropy over the real tokens of completion `i` (rollout policy,
    detached) and `P̄_g` the mean of `P_j` over the members of its group that are scored and non-empty. A
    confident (low-entropy) completion gets a larger advantage magnitude than an uncertain one with the same
    reward; equal entropies give GRPO's advantages back. The division uses `max(P_i, edge_grpo_eps)`.

    Shapes: `advantages` `(N,)`, `ctx.entropies` and `ctx.completion_mask` `(N, T)`; returns `(N, T)`.

    Official code: `ZhangXJ199/EDGE-GRPO@cbe13ca8e21af39f7b4c791bc6226348267dbfb2`,
    `trl_edge/trainer/grpo_aha_trainer.py:GRPOAhaTrainer._compute_loss` l.1205-1239 (EDA: `advantages /
    per_entropy_mean * all_entropy_mean.mean(0)`), entropies from `_get_per_token_logps(..., EDA=True)` l.658-688.
    Where it differs, and what we do:
    - the official `per_entropy_mean = mean(per_entropy, dim=1)` averages over *all* positions, padding
      included; the paper defines the response entropy over its own tokens, so we use the masked mean (paper wins);
    - the official entropy is the current policy's at loss time and is not detached (gradient flows through
      `1/P_i`); ours is the rollout policy's, detached, computed once per generation batch (identical values in the
      official on-policy setting, `num_iterations=1`), since this stage produces advantages, not a loss term;
    - the official normaliser is the mean over the micro-batch gathered from all processes; with its script
      (8 processes × 1 completion, `num_generations=8`) that micro-batch is exactly one group, so we take the group
      mean (the paper's group-relative reading), independent of how the batch is split;
    - Guided Error Correction (GEC, l.974-1061: wrong responses corrected with the reference answer or solution at
      generation time) is the flag `edge_grpo_gec` (on in this id's flags; `trl_groupx/sampling/edge_grpo_gec.py`),
      applied by the trainer after scoring, before this stage.
    Edge cases: NaN-reward (unscored) and empty completions get 0 and are left out of `P̄_g`; a group with no such
    member keeps advantage 0.
    """
    if ctx.entropies is None:
        raise ValueError("token_weighting='edge_grpo' needs rollout entropies in the TokenContext.")
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("edge_grpo", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    lengths = mask.sum(-1)
    entropies = torch.where(mask, ctx.entropies.detach().float(), torch.zeros_like(ctx.entropies, dtype=torch.float))
    seq_h = entropies.sum(-1) / lengths.clamp(min=1)  # (N,) P_i over real tokens only
    member = lengths > 0
    if ctx.rewards is not None:
        member = member & ~torch.isnan(ctx.rewards.to(seq_h.device))
    by_group = grouped(torch.where(member, seq_h, torch.zeros_like(seq_h)), ctx.group_size)
    count = grouped(member.float(), ctx.group_size).sum(1, keepdim=True)
    group_mean = (by_group.sum(1, keepdim=True) / count.clamp(min=1)).expand_as(by_group).reshape(-1)
    scaled = adv * group_mean / seq_h.clamp(min=edge_grpo_eps)
    scaled = torch.where(member, scaled, torch.zeros_like(scaled))
    return scaled[:, None] * mask.to(scaled.dtype)
