"""Off-policy GRPO (arXiv:2505.22257): GRPO on rollouts from a policy that lags the trained one by up to `v` steps."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .surrogates import clipped_surrogate


def _validate(config) -> None:
    lag = config.offpolicy_grpo_lag
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
        raise ValueError(
            f"offpolicy_grpo_lag={lag!r} must be an integer >= 1: the number of optimizer steps between two syncs of "
            "the rollout policy (paper: v = 10; 1 = on-policy GRPO)."
        )
    expected = lag * config.gradient_accumulation_steps
    if config.steps_per_generation != expected:
        raise ValueError(
            f"offpolicy_grpo_lag={lag} regenerates rollouts (and syncs the rollout weights) every {lag} optimizer "
            f"steps, i.e. every {lag} x gradient_accumulation_steps={config.gradient_accumulation_steps} "
            f"micro-batches: set steps_per_generation={expected} (got {config.steps_per_generation}; leave "
            "generation_batch_size unset), or change offpolicy_grpo_lag."
        )


@register(
    "offpolicy_grpo",
    name="Off-policy GRPO (GRPO with a lagged rollout policy)",
    paper="Revisiting Group Relative Policy Optimization: Insights into On-Policy and Off-Policy Training, "
    "arXiv:2505.22257",
    official_code=None,
    stage="objective",
    flags={
        "loss_type": "offpolicy_grpo",
        "offpolicy_grpo_lag": 10,
        "steps_per_generation": 10,
        "gradient_accumulation_steps": 1,
        "num_iterations": 1,
        "loss_aggregation": "sequence_mean",
    },
    params=("offpolicy_grpo_lag",),
    validate=_validate,
)
def offpolicy_grpo_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    delta: float | None,
    importance_sampling_level: str,
) -> torch.Tensor:
    """Off-policy GRPO: the clipped GRPO surrogate, with the ratio taken against the *lagged* rollout policy `α`.

    The paper (Mroueh et al., no public code) replaces GRPO's on-policy `π_k` by `α = π_{k-v}`-style stale
    rollouts: the inference server's weights are synced every `v` optimizer steps, the group statistics
    (advantages) are computed on `α`'s samples, and the update maximises the off-policy clipped surrogate

        l_t = -min(ρ_t Â_i, clip(ρ_t, 1-ε, 1+ε_high) Â_i),   ρ_t = π_θ(o_t | ·) / α(o_t | ·)

    (plus TRL's `beta`-weighted k3 KL, off by default), backed by the paper's reward-improvement lower bound. It is
    TRL's GRPO machinery with a sync period: with `offpolicy_grpo_lag = v` the trainer generates one batch of
    `v` optimizer steps' rollouts (`steps_per_generation = v × gradient_accumulation_steps`, enforced by
    `validate`), stores their log-probs under the generating weights (`old_per_token_logps`, taken before any
    update), and consumes them over the next `v` steps, so the rollouts of step `k` come from the weights of
    step `v⌊k/v⌋` — exactly a server synced every `v` steps (generating all `v` batches at the sync, or one per
    step from the same frozen weights, draws from the same distribution). `v = 1` is on-policy GRPO (TRL then skips the
    stored log-probs and `ρ = 1`); `num_iterations` is the paper's `i` (1 in its runs; with `i > 1` TRL trains each
    batch `i` times, so the sync period becomes `v·i` optimizer steps).

    Gradient per unclipped token `-Â ρ_t ∇logπ_θ`; 0 where the clip is active (`Â > 0, ρ > 1+ε_high` or
    `Â < 0, ρ < 1-ε`). Shapes: `ctx.*` `(B, T)`, advantages `(B, 1)` or `(B, T)`; returns `(B, T)`.

    Choices: the paper writes the objective per response (ratio `π(y|x)/α(y|x)`, GRPO's notation) and its
    experiments build on TRL's GRPO, whose ratio is per token: we use the per-token ratio and GRPO's
    `sequence_mean` normaliser (both TRL's `loss_type="grpo"`, so this variant matches it number for number on the
    same batch); the std epsilon is the advantage stage's (TRL: 1e-4). The paper's runs use `v = 10`, `i = 1`
    (flags), one vLLM server and seven training GPUs; ε, ε_high and β are TRL's own flags here.
    """
    level = importance_sampling_level
    return clipped_surrogate(ctx, epsilon=epsilon, epsilon_high=epsilon_high, delta=delta,
                             importance_sampling_level=level)
