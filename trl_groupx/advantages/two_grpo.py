"""2-GRPO: GRPO with two rollouts per prompt (arXiv:2510.00977)."""

from __future__ import annotations

import torch

from ..registry import register
from ._checks import reject_infinite
from .group_norm import group_normalized_advantages


def _validate(config) -> None:
    if config.num_generations != 2:
        raise ValueError(
            f"advantage_estimator='two_grpo' is GRPO with two rollouts per prompt; set num_generations=2 (got "
            f"{config.num_generations}), or use advantage_estimator='grpo' for larger groups."
        )
    if config.num_generations_eval not in (None, 2):
        raise ValueError(
            f"advantage_estimator='two_grpo' needs num_generations_eval unset or 2, got {config.num_generations_eval}."
        )


@register(
    "two_grpo",
    name="2-GRPO (GRPO with two rollouts per prompt)",
    paper="It Takes Two: Your GRPO Is Secretly DPO, arXiv:2510.00977",
    official_code=None,
    stage="advantages",
    flags={"advantage_estimator": "two_grpo", "num_generations": 2},
    validate=_validate,
)
def two_grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """2-GRPO: GRPO's own group-normalised advantage (TRL's numbers, `scale_rewards="group"`) with `G = 2`.

    For a pair with rewards `(r_1, r_2)`, `d = r_1 − r_2`: mean `(r_1 + r_2)/2`, unbiased std `|d|/√2`, so
    `A_1 = −A_2 = (d/2) / (|d|/√2 + 1e-4) ≈ sign(d)/√2`: equal and opposite whenever the rewards differ (whatever
    the margin), 0 for a tie. The update is then `(1/√2)·∇(s(y⁺) − s(y⁻))` (with `s` the length-normalised
    log-likelihood under the surrogate), a DPO-style contrast between the preferred and the rejected rollout, which
    is the paper's reformulation. The paper (no official code) reports 2-GRPO on par with 16-GRPO with 1/8 of the
    rollouts; spend the saved rollouts on more prompts per batch.

    This is a dispatched variant (not only `num_generations=2`) so that a config that means 2-GRPO is checked:
    `validate` requires `num_generations == 2` (and `num_generations_eval` unset or 2). The function itself
    accepts any `G` and then equals TRL's GRPO advantage (`group_normalized_advantages`), so NaN rewards are left
    out of the statistics and get 0, and a pair with one unscored member gets 0 (std of one value). ±inf rewards
    raise a `ValueError`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, pairs contiguous, NaN where unscored.
        group_size (`int`): `G` (2 under a validated config).

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "two_grpo")
    return group_normalized_advantages(rewards, group_size, scale_rewards="group")
