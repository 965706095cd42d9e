"""WAPO: Winner Advantage Policy Optimization — train on positive-advantage completions only."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, clean_advantages

_OFFICIAL = "layer6ai-labs/wapo@ca7025022c42acfbcd43d67c9ee5387a1d0c38c2:verifiers/rl/trainer/trainer.py"


def _validate(config) -> None:
    if not isinstance(config.wapo_positive_group_scale, bool):
        raise ValueError(
            f"wapo_positive_group_scale must be True or False, got {config.wapo_positive_group_scale!r}."
        )


@register(
    "wapo",
    name="WAPO (Winner Advantage Policy Optimization)",
    paper="Winner Advantage Policy Optimization, arXiv:2606.16154",
    official_code=_OFFICIAL,
    stage="token_weights",
    flags={"token_weighting": "wapo", "wapo_positive_group_scale": True, "scale_rewards": "none",
           "loss_type": "dr_grpo", "epsilon_high": 9.0, "beta": 0.0},
    params=("wapo_positive_group_scale",),
    validate=_validate,
)
def wapo_token_advantages(
    advantages: torch.Tensor, ctx: TokenContext, *, wapo_positive_group_scale: bool
) -> torch.Tensor:
    r"""WAPO: keep the advantage of positive-advantage completions, zero every other one.

        A'_i = s · A_i · 1[A_i > 0]          broadcast to the completion tokens of i, 0 on padding
        s    = (#groups) / max(1, #groups holding at least one A_i > 0)   if `wapo_positive_group_scale`, else 1

    Shapes: `advantages` `(N,)` (the advantage stage's output, `N/G` contiguous groups), `ctx.completion_mask`
    `(N, T)`; returns `(N, T)`.

    Official code (`layer6ai-labs/wapo@ca7025022c42acfbcd43d67c9ee5387a1d0c38c2`, a fork of verifiers):
    - advantage `A = r − mean_g(r)` (no std): `verifiers/rl/trainer/orchestrator.py:Orchestrator.generate_batch`
      l.306-333 (`else` branch for `wapo`);
    - sequences with `A ≤ 0` are masked out (`mask_negative_advantages`, forced on for `wapo` at
      `trainer.py:RLTrainer.__init__` l.177-184; applied in `trainer.py:RLTrainer.compute_loss` l.1119-1124);
    - the surrogate is `-min(ρ·A, min(ρ, 1+clip_eps)·A)` with `clip_eps = 9` (README), `compute_loss` l.1274-1282;
    - the loss is `Σ_tokens(per-token loss)/(G · max_seq_len)`, divided by the number of groups with a positive
      completion, `orchestrator.py` l.494-557 (`effective_mean_level == "group"`, `wapo` branch).

    What this token-weight variant does, and what the rest of the pipeline must do to reproduce the paper:
    - the positive-only mask (strict `A > 0`, as the official `<= 0` test) is the token-weight part;
    - `A = r − mean` is the advantage stage's job: use `scale_rewards="none"` (TRL's mean-centred advantage). With
      TRL's default std scaling the *set* of kept completions is the same, only their scale differs per group. Any
      other advantage estimator composes (its positive advantages are kept);
    - the normaliser is objective-side. With `loss_type="dr_grpo"` TRL divides the summed token loss by
      `N · max_completion_length = #groups · G · max_completion_length`; multiplying every advantage by the
      batch constant `s` turns this into the official `Σ / (G · L · #groups with a positive)` exactly (every TRL
      surrogate is linear in a positive rescaling of `A`). `s` is on by default (`wapo_positive_group_scale`) and is
      a plain learning-rate rescaling under other loss types. Official `max_seq_len` corresponds to TRL's
      `max_completion_length` here (a length constant, no effect on direction);
    - the upper-only ratio clip at `1 + 9` is TRL's clip with `epsilon_high=9.0`: for `A > 0` the lower clip of
      `min(ρA, clip(ρ, 1−ε, 1+ε_high)A)` is never active, so the two are identical.
    Choices: NaN-reward (unscored) rollouts get 0 and do not make their group "positive"; a group is counted in
    `#groups` whatever its content (official: every prompt of the batch). `s` uses the global batch handed to this
    stage; the official normaliser is per generation batch too.
    """
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("wapo", advantages, ctx.rewards)
    positive = adv > 0
    kept = torch.where(positive, adv, torch.zeros_like(adv))
    if wapo_positive_group_scale:
        n_groups = advantages.shape[0] // ctx.group_size
        n_pos_groups = grouped(positive, ctx.group_size).any(dim=1).sum()
        kept = kept * (n_groups / n_pos_groups.clamp(min=1).to(kept.dtype))
    mask = ctx.completion_mask.to(kept.dtype)
    return kept[:, None] * mask
