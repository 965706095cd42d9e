"""RS-GRPO (Reward-Scoped GRPO, EVisRAG): each reward normalised in its group and applied to its own scope."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped, nan_std
from ..registry import register
from ._checks import check_groups, reject_sequence_averaging_objective
from .blocks import check_block_inputs, check_block_tags, spread_block_advantages

_OFFICIAL = "OpenBMB/VisRAG@f35d232d4c6c7350e12e0f72911404dbae4042ab:src/rsgrpo/verl"
_EPS = 1e-6  # official `eps` of compute_router_outcome_advantage


def _validate(config) -> None:
    from ..objective import resolved_aggregation

    check_block_tags("rs_grpo_block_tags", config.rs_grpo_block_tags)
    if not isinstance(config.rs_grpo_scope_average, bool):
        raise ValueError(f"rs_grpo_scope_average must be True or False, got {config.rs_grpo_scope_average!r}.")
    if config.scale_rewards != "group":
        raise ValueError(
            f"token_weighting='rs_grpo' normalises each scoped reward itself (mean/std, ε 1e-6), so scale_rewards="
            f"{config.scale_rewards!r} would be ignored; leave scale_rewards at its default."
        )
    reject_sequence_averaging_objective("rs_grpo", config)
    aggregation = resolved_aggregation(config)
    if config.rs_grpo_scope_average and aggregation != "global_token_mean":
        raise ValueError(
            f"rs_grpo_scope_average=True rescales token advantages for a global token-mean loss, but loss_type="
            f"{config.loss_type!r} normalises by {aggregation!r}; use loss_type='dapo', or 'dual_clip' with "
            "loss_aggregation='global_token_mean', or set rs_grpo_scope_average=False."
        )


def scoped_group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(N, K)`: `(r_k − mean_g r_k) / (std_g r_k + 1e-6)` per reward column (Bessel std); NaN rewards are left
    out of the statistics and get 0, as does a group with fewer than two scored rollouts (std undefined)."""
    r = grouped(rewards.float(), group_size)
    mean = torch.nanmean(r, dim=1, keepdim=True)
    adv = (r - mean) / (nan_std(r, dim=1, keepdim=True) + _EPS)
    return torch.nan_to_num(adv, nan=0.0).reshape(rewards.shape)


def scope_average_weights(token_adv: torch.Tensor, blocks: torch.Tensor, mask: torch.Tensor, n_scopes: int):
    """`(n_scopes,)` weights `w_k = n_tot / (n_k · n_active)` that turn a global token mean of the weighted token
    losses into the official mean of the active scopes' token-mean losses (see the variant's docstring)."""
    real = mask.bool()
    n_tot = real.sum().to(token_adv.dtype)
    counts = torch.stack([((blocks == k) & real).sum() for k in range(n_scopes)]).to(token_adv.dtype)
    active = torch.stack([((blocks == k) & real & (token_adv != 0)).any() for k in range(n_scopes)])
    n_active = active.sum().clamp(min=1).to(token_adv.dtype)
    return torch.where(active, n_tot / (counts.clamp(min=1) * n_active), torch.zeros_like(counts))


@register(
    "rs_grpo",
    name="EVisRAG / RS-GRPO (Reward-Scoped GRPO)",
    paper="VisRAG 2.0: Evidence-Guided Multi-Image Reasoning in Visual Retrieval-Augmented Generation (EVisRAG), "
          "arXiv:2510.09733",
    official_code=f"{_OFFICIAL}/trainer/core_algos.py",
    stage="token_weights",
    flags={"token_weighting": "rs_grpo", "rs_grpo_block_tags": ["evidence", "answer"], "rs_grpo_scope_average": True,
           "loss_type": "dual_clip", "dual_clip_c": 3.0, "epsilon": 0.2, "epsilon_high": 0.28,
           "loss_aggregation": "global_token_mean", "beta": 0.0},
    requires=("rewards_per_func", "token_blocks"),
    params=("rs_grpo_block_tags", "rs_grpo_scope_average"),
    replaces=("advantages",),
    validate=_validate,
)
def rs_grpo_token_advantages(advantages: torch.Tensor, ctx: TokenContext, *, rs_grpo_scope_average: bool):
    r"""RS-GRPO: reward `k` is group-normalised on its own and trains only the tokens of its scope `k`.

        A_k(i)  = (r_k(i) − mean_g r_k) / (std_g r_k + 1e-6)          (Bessel std, per reward column)
        A_{i,t} = w_{b(i,t)} · A_{b(i,t)}(i)   on the tokens of scope b(i,t); 0 outside every scope and on padding
        w_k     = n_tot / (n_k · n_active)   if `rs_grpo_scope_average`, else 1

    with `n_k` the real tokens of scope `k` in the batch, `n_tot` all real tokens, `n_active` the scopes with at
    least one token of non-zero advantage (`w_k = 0` for the others, which have no loss anyway).

    Shapes: `advantages` `(N,)` (unused, `replaces=("advantages",)`), `ctx.rewards_per_func` `(N, K)`,
    `ctx.token_blocks` `(N, T)` long in `[-1, K)` (scope `k` = block `k` of `rs_grpo_block_tags`,
    `trl_groupx/token_weights/blocks.py`), `ctx.completion_mask` `(N, T)`; returns `(N, T)`.

    Official code (`OpenBMB/VisRAG@f35d232d4c6c7350e12e0f72911404dbae4042ab`, under `src/rsgrpo/verl/`):
    - advantages: `trainer/core_algos.py:compute_router_outcome_advantage` (l.196-245): per prompt and per reward
      column, `(score − mean) / (std + eps)` with `torch.std` (Bessel) and `eps = 1e-6`;
    - scopes: `workers/reward/function.py:BatchFunctionRewardManager.compute_reward` (l.108-208): each reward has a
      `(start, end)` token-mask pair (e.g. the evidence reward from the start to `<think>`, accuracy from `<think>`
      to the end), found as the first occurrence of the tag's token ids;
    - loss: `trainer/core_algos.py:average_loss` mode `"router"` (l.362-388) and `compute_policy_loss`
      (l.391-472): dual-clip PPO (clip 0.2 / 0.28, dual 3) per scope, each scope's loss the token mean over its
      own tokens; `workers/actor/dp_actor.py:DataParallelPPOActor.update_policy` (l.286) sums the per-scope losses
      and divides by the number of non-zero ones: `L = Σ_k L_k / #{k: L_k ≠ 0}`.

    The loss part without an objective-stage change: every objective's per-token surrogate is positively
    homogeneous in the advantage (`ℓ(cA) = c·ℓ(A)` for `c > 0`, PPO clip and dual clip included), so with disjoint
    scopes and a global token-mean loss `Σ_{i,t} ℓ(w_k A) / n_tot = Σ_k (Σ_{t∈k} ℓ(A_k)/n_k) / n_active`, the
    official `Σ_k L_k / n_active`. Hence the defaults `loss_type="dual_clip"`, `loss_aggregation=
    "global_token_mean"` (checked at config construction while `rs_grpo_scope_average` is on). Differences from the
    official loss, and why:
    - `n_active` counts scopes with any non-zero token advantage in the generation batch; the official code counts
      non-zero per-scope losses per micro-batch at the current ratio. They agree except when a scope's losses
      cancel exactly or a micro-batch holds no token of a scope; the official count is not available before the
      loss, and an objective-stage version would need the scope ids in `ObjectiveContext`, which it does not have.
    - the official reference KL (`kl_loss` per scope) is scope-averaged too; here `beta` (default 0) adds TRL's
      KL on all tokens unweighted.
    - the official scopes overlap (a "format" reward scoped to the whole response); one `(N, T)` advantage holds one
      scope per token, so scopes here are the disjoint blocks of `blocks.py`. A whole-response reward can be
      folded into one of the blocks' rewards. Choice: a missing closing tag ends the scope where the next scope
      opens (official: at the next scope's start tag), tokens after the last scope's closing tag are outside.
    - the paper's model is a multi-image VLM with six scoped rewards; the mechanism is text-only and reward-agnostic.
    NaN rewards: left out of their column's statistics, advantage 0 on that scope. `reward_weights` do not enter.
    """
    check_groups(ctx.completion_mask.shape[0], ctx.group_size)
    rewards, blocks = check_block_inputs("rs_grpo", ctx)
    token_adv = spread_block_advantages(scoped_group_advantages(rewards, ctx.group_size), blocks, ctx.completion_mask)
    if rs_grpo_scope_average:
        weights = scope_average_weights(token_adv, blocks, ctx.completion_mask, rewards.shape[1])
        token_adv = token_adv * spread_block_advantages(weights.expand_as(rewards), blocks, ctx.completion_mask)
    return token_adv
