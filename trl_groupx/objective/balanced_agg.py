"""Balanced Aggregation (BA): PPO's clipped surrogate, normalised per advantage-sign class within each group."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .surrogates import clipped_surrogate


def _validate(config) -> None:
    if config.loss_aggregation not in (None, "balanced"):
        raise ValueError(
            f"loss_type='balanced_agg' is Balanced Aggregation; loss_aggregation={config.loss_aggregation!r} would "
            "replace it. Leave loss_aggregation unset (or 'balanced'), or use loss_type='grpo' for other normalisers."
        )


@register(
    "balanced_agg",
    name="BA (Balanced Aggregation)",
    paper="Balanced Aggregation: Understanding and Fixing Aggregation Bias in GRPO, arXiv:2605.04077",
    official_code=None,
    stage="objective",
    flags={"loss_type": "balanced_agg", "loss_aggregation": "balanced", "balanced_agg_scope": "group"},
    validate=_validate,
)
def balanced_agg_surrogate(
    ctx: ObjectiveContext, *, epsilon: float, epsilon_high: float | None
) -> torch.Tensor:
    """Per-token loss of BA: GRPO's clipped surrogate `l_t = -min(ρ_t A_t, clip(ρ_t, 1-ε, 1+ε_high) A_t)`.

    BA changes only the aggregation (Zeng et al., arXiv:2605.04077): within each group, token losses are averaged
    separately over the positive- and the negative-advantage rollouts and the two means are combined with
    sequence-count weights, `L_g = (|P|/G)·tokmean(P) + (|N|/G)·tokmean(N)`. The trainer computes the equivalent
    per-rollout scale `c_i` on the global batch (`objective.aggregation.balanced_sequence_scale`, which documents
    the choices the abstract leaves open) and aggregates `mean_i c_i Σ_t l_it`; `loss_aggregation="balanced"` gives
    the same normaliser to any other trl_groupx objective. No official code; the surrogate follows TRL's GRPO.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`. Returns `(B, T)`.
    """
    return clipped_surrogate(ctx, epsilon=epsilon, epsilon_high=epsilon_high, delta=None, importance_sampling_level="token")
