"""F-GRPO: focal-style difficulty-aware scaling of group advantages against tail-miss (arXiv:2602.06717)."""

from __future__ import annotations

import math

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite, reject_outside_unit_interval
from .group_norm import group_normalized_advantages


def _validate(config) -> None:
    gamma = config.focal_tailmiss_gamma
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
        raise ValueError(
            f"focal_tailmiss_gamma must be a finite number >= 0, got {gamma!r}; the paper uses 0.5 (also 1, 2); "
            "0 switches the scaling off."
        )
    threshold = config.focal_tailmiss_success_threshold
    if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(
            f"focal_tailmiss_success_threshold must be None (rewards in [0, 1], p̂ = group mean) or a finite "
            f"number (success = reward >= threshold), got {threshold!r}."
        )


@register(
    "focal_tailmiss",
    name="F-GRPO (Focal-style difficulty-aware scaling for tail-miss)",
    paper="F-GRPO: Don't Let Your Policy Learn the Obvious and Forget the Rare, arXiv:2602.06717",
    official_code=None,
    stage="advantages",
    flags={"advantage_estimator": "focal_tailmiss", "focal_tailmiss_gamma": 0.5},
    params=("focal_tailmiss_gamma", "focal_tailmiss_success_threshold"),
    validate=_validate,
)
def focal_tailmiss_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    focal_tailmiss_gamma: float = 0.5,
    focal_tailmiss_success_threshold: float | None = None,
    scale_rewards: str = "group",
) -> torch.Tensor:
    """F-GRPO: GRPO's group-normalised advantage times the focal weight `(1 − p̂)^γ` of its group.

    `A_i = Â_i · (1 − p̂_g)^γ`, with `Â_i` exactly TRL's group-normalised advantage
    (`trl_groupx.advantages.group_norm.group_normalized_advantages` with the config's `scale_rewards`: z-score with
    the group std for `"group"`, the batch std for `"batch"`, no division for `"none"`) and `p̂_g = X_g / N_g` the
    sampled success rate of the group (X successes among N scored rollouts). Paper §4, Eq. 11-13: focal weight
    `g(x) = (1 − μ̂_pos(x))^γ` times the group-relative advantage (`A · (1 − X/N)^γ`, ../shared/official-code.md):
    groups that are nearly solved push less probability onto their common sampled solutions. γ = 0 reproduces
    the base advantages bit for bit
    (`x^0 = 1`), an all-correct group has weight 0 and an all-equal group keeps advantage 0. The weight depends only
    on the group's reward vector; group size and rollout cost are unchanged. Paper: γ ∈ {0.5, 1, 2}, 0.5 picked
    (default), N = 8, lr 1e-6; the scaling is orthogonal to the objective (used with GRPO, DAPO and CISPO losses:
    set `loss_type` freely). No official code.

    How it composes: the paper presents the weight as a multiplier on any group-relative advantage. Here it is an
    advantage variant whose base is GRPO's (TRL's) advantage, so it composes with every loss type, token-weight
    and sampling variant, but not with another advantage estimator (that would need a separate group-weighting
    stage in the core). It reads TRL's `scale_rewards`, so `"batch"` and `"none"` (Dr. GRPO) bases work too.

    Choices the paper leaves open: "success" for non-binary rewards. By default (`focal_tailmiss_success_threshold
    = None`) rewards must lie in `[0, 1]` and `p̂` is the group's mean reward (for 0/1 rewards exactly `X/N`);
    with a threshold, success is `reward >= threshold` (for composite rewards such as accuracy + format). NaN
    rewards are unscored: left out of `Â`'s statistics and of `X` and `N`, and get advantage 0. ±inf rewards
    raise a `ValueError`. `G = 1`: `Â = 0`, so the advantage is 0.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.
        focal_tailmiss_gamma (`float`): focal exponent γ ≥ 0.
        focal_tailmiss_success_threshold (`float` or `None`): success cut-off, or `None` for the mean reward.
        scale_rewards (`str`): TRL's `"group"`, `"batch"` or `"none"` for the base advantage.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "focal_tailmiss")
    if focal_tailmiss_success_threshold is None:
        reject_outside_unit_interval(rewards, "focal_tailmiss", "p̂ is the group's mean reward; or set "
                                     "focal_tailmiss_success_threshold to count successes")
        success = rewards
    else:
        success = torch.where(torch.isnan(rewards), rewards, (rewards >= focal_tailmiss_success_threshold).to(rewards))
    base = group_normalized_advantages(rewards, group_size, scale_rewards=scale_rewards)
    p_hat = torch.nanmean(grouped(success, group_size), dim=1)  # (N/G,), NaN for an all-NaN group
    weight = torch.pow((1.0 - p_hat).clamp(min=0.0), focal_tailmiss_gamma).repeat_interleave(group_size)
    return torch.nan_to_num(base * weight.to(base), nan=0.0)
