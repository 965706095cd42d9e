"""GTPO and GRPO-S: entropy-shaped token and sequence rewards (arXiv:2508.04349)."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register

_EPS = 1e-6  # entropy / sum guards (the verl GTPO port's value)
_WHITEN_EPS = 1e-8  # inside the sqrt of the z-score, as verl's masked_whiten


def _masked_zscore(values: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """z-score of `values` over the positions in `select` (unbiased variance); 0 elsewhere and for sets < 2."""
    count = select.sum()
    if count < 2:
        return torch.zeros_like(values)
    chosen = values[select]
    centred = values - chosen.mean()
    var = ((chosen - chosen.mean()) ** 2).sum() / (count - 1)
    return torch.where(select, centred / torch.sqrt(var + _WHITEN_EPS), torch.zeros_like(values))


def _gtpo_token_rewards(
    entropies: torch.Tensor, success: torch.Tensor, failure: torch.Tensor, mask: torch.Tensor, group_size: int,
    alpha1: float, alpha2: float,
) -> torch.Tensor:
    """GTPO Eq. 3 / Eq. 5 shaped token rewards, `(N, T)`, 0 on padding and unscored rows."""
    pos = mask & success[:, None]  # (N, T)
    neg = mask & failure[:, None]
    h = entropies.clamp(min=0.0)
    # Per group and position t: Σ_{k∈O+_t} H_kt and d_t = |O+_t|; Σ_{k∈O-_t} 1/H_kt and h_t = |O-_t|.
    sum_h = grouped(h * pos, group_size).sum(1).repeat_interleave(group_size, dim=0)
    d_t = grouped(pos.float(), group_size).sum(1).repeat_interleave(group_size, dim=0)
    inv_h = 1.0 / (h + _EPS)
    sum_inv = grouped(inv_h * neg, group_size).sum(1).repeat_interleave(group_size, dim=0)
    h_t = grouped(neg.float(), group_size).sum(1).repeat_interleave(group_size, dim=0)
    shaped_pos = alpha1 + alpha2 * h / (sum_h + _EPS) * d_t
    shaped_neg = -alpha1 - alpha2 * inv_h / (sum_inv + _EPS) * h_t
    return torch.where(pos, shaped_pos, torch.where(neg, shaped_neg, torch.zeros_like(h)))


def _grpo_s_advantages(
    entropies: torch.Tensor, success: torch.Tensor, failure: torch.Tensor, mask: torch.Tensor, group_size: int,
    beta1: float, beta2: float,
) -> torch.Tensor:
    """GRPO-S: sequence-mean entropy shaping, then a per-group z-score; `(N,)`."""
    lengths = mask.sum(-1)
    seq_h = (entropies.clamp(min=0.0) * mask).sum(-1) / lengths.clamp(min=1)  # (N,)
    # Empty completions have no entropy to compare: they take no part in the shaping sums (their own advantage
    # is irrelevant, they have no tokens).
    pos, neg = success & (lengths > 0), failure & (lengths > 0)
    sum_h = grouped(seq_h * pos, group_size).sum(1).repeat_interleave(group_size)
    n_pos = grouped(pos.float(), group_size).sum(1).repeat_interleave(group_size)
    inv_h = 1.0 / (seq_h + _EPS)
    sum_inv = grouped(inv_h * neg, group_size).sum(1).repeat_interleave(group_size)
    n_neg = grouped(neg.float(), group_size).sum(1).repeat_interleave(group_size)
    shaped = torch.where(pos, beta1 + beta2 * seq_h / (sum_h + _EPS) * n_pos, torch.full_like(seq_h, float("nan")))
    shaped = torch.where(neg, -beta1 - beta2 * inv_h / (sum_inv + _EPS) * n_neg, shaped)
    by_group = grouped(shaped, group_size)
    mean = torch.nanmean(by_group, dim=1, keepdim=True)
    count = (~torch.isnan(by_group)).sum(1, keepdim=True)
    var = torch.nansum((by_group - mean) ** 2, dim=1, keepdim=True) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.full_like(var, float("nan")))
    return torch.nan_to_num(((by_group - mean) / (std + _EPS)).reshape(-1), nan=0.0)


def _validate(config) -> None:
    if config.gtpo_level not in ("token", "sequence"):
        raise ValueError(f"gtpo_level must be 'token' (GTPO) or 'sequence' (GRPO-S), got {config.gtpo_level!r}.")
    if config.gtpo_normalization not in ("separate", "joint"):
        raise ValueError(f"gtpo_normalization must be 'separate' or 'joint', got {config.gtpo_normalization!r}.")


@register(
    "gtpo_entropy",
    name="GTPO / GRPO-S (dynamic entropy weighting)",
    paper="GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy, arXiv:2508.04349",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "gtpo_entropy", "gtpo_level": "token", "gtpo_alpha1": 1.0, "gtpo_alpha2": 0.1},
    requires=("entropies", "group_structure"),
    replaces=("advantages",),
    validate=_validate,
    params=("gtpo_level", "gtpo_alpha1", "gtpo_alpha2", "gtpo_normalization", "gtpo_success_threshold"),
)
def gtpo_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    gtpo_level: str,
    gtpo_alpha1: float,
    gtpo_alpha2: float,
    gtpo_normalization: str,
    gtpo_success_threshold: float,
) -> torch.Tensor:
    r"""GTPO (token level) and GRPO-S (sequence level): entropy-shaped rewards turned into advantages.

    Success set `O+ = {i: r_i > thr}`, failure set `O-` the other scored rollouts, per group; `H_{i,t}` the
    rollout policy's entropy at position `t` (detached); `O±_t` the members of `O±` that still have a token at `t`,
    `d_t = |O+_t|`, `h_t = |O-_t|`.

    GTPO (`gtpo_level="token"`), Eq. 3 and 5:

        r̃⁺_{i,t} = α1 + α2 · H_{i,t} / Σ_{k∈O+_t} H_{k,t} · d_t
        r̃⁻_{j,t} = -α1 - α2 · (1/H_{j,t}) / Σ_{k∈O-_t} (1/H_{k,t}) · h_t

    then Eq. 6, `gtpo_normalization="separate"`: z-score the `O+` tokens and the `O-` tokens of the whole batch
    apart (unbiased variance, `(x - μ)/sqrt(σ² + 1e-8)`); `"joint"`: one z-score over all scored tokens.

    GRPO-S (`gtpo_level="sequence"`), with the mean entropy `Ĥ_i` of each completion:

        r̂_i = β1 + β2 · Ĥ_i / Σ_{k∈O+} Ĥ_k · |O+|          (i ∈ O+)
        r̂_j = -β1 - β2 · (1/Ĥ_j) / Σ_{k∈O-} (1/Ĥ_k) · |O-|  (j ∈ O-)

    then `A_i = (r̂_i - mean_g r̂)/(std_g r̂ + 1e-6)` per group (unbiased std), broadcast to every token.

    Shapes: `advantages` `(N,)` (not used: the shaped rewards replace them), `ctx.rewards` `(N,)`,
    `ctx.entropies` and `ctx.completion_mask` `(N, T)`. Returns `(N, T)`, 0 on padding.

    Citation: Tan et al., arXiv:2508.04349. No official code. The method section could not be read here; the
    equations above are those of two independent implementations that agree on them: teilomillet/textpolicy@
    e88fc30e319ae6ce92613bd8c925b4b5381e99cd:textpolicy/algorithms/grpo.py (`compute_gtpo_shaped_rewards`,
    `normalize_gtpo_advantages`) and a verl port (`compute_gtpo_advantage`, `compute_grpo_s_advantage`).
    Choices left open, and ours:
    - success is `r > gtpo_success_threshold` (default 0, the verl port; textpolicy uses 0.5), and the
      positive base term is the constant α1 (verl port; textpolicy uses α1·r — identical for binary rewards);
    - α1 = 1.0, α2 = 0.1 as both implementations label "the paper's experimental values"; GRPO-S's β1, β2 are
      not published and reuse α1, α2;
    - Eq. 6 scope: the whole generation batch (verl port). Note that with `"separate"` the mean of each set is
      exactly ±(α1+α2) (the shaping conserves the total reward), so the z-score removes the outcome sign: tokens
      are ranked by entropy share inside their set. `"joint"` keeps the sign for typical groups;
    - unscored rollouts (NaN reward) and padding take no part in any sum and get 0; an all-success or
      all-failure group still gets entropy-driven token advantages, as in both implementations.
    """
    if ctx.entropies is None or ctx.rewards is None:
        raise ValueError("token_weighting='gtpo_entropy' needs rollout entropies and rewards in the TokenContext.")
    mask = ctx.completion_mask.bool()
    scored = ~torch.isnan(ctx.rewards)
    success = scored & (ctx.rewards > gtpo_success_threshold)
    failure = scored & ~success
    entropies = ctx.entropies.detach().float()
    if gtpo_level == "sequence":
        seq_adv = _grpo_s_advantages(entropies, success, failure, mask, ctx.group_size, gtpo_alpha1, gtpo_alpha2)
        return seq_adv[:, None] * mask
    shaped = _gtpo_token_rewards(entropies, success, failure, mask, ctx.group_size, gtpo_alpha1, gtpo_alpha2)
    pos, neg = mask & success[:, None], mask & failure[:, None]
    if gtpo_normalization == "joint":
        return _masked_zscore(shaped, pos | neg)
    return _masked_zscore(shaped, pos) + _masked_zscore(shaped, neg)
