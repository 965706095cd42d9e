"""Sign advantage: a fixed reference instead of the group mean (arXiv:2605.07689)."""

from __future__ import annotations

import torch

from ..registry import register


@register(
    "sign_adv",
    name="Sign advantage (fixed-reference A = 2r - 1)",
    paper="Fixed-reference sign advantages for GRPO (pass@G failure descent), arXiv:2605.07689",
    official_code=None,
    stage="advantages",
)
def sign_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Sign advantage: drop group-mean centring and use the fixed reference `A_i = 2 r_i - 1`.

    For binary rewards `r ∈ {0, 1}` this is `+1` for a correct and `-1` for a wrong completion, so all-correct and
    all-wrong groups still carry gradient (arXiv:2605.07689; no official code). The result does not depend on `G`
    or on the other members of the group.

    Choices the paper leaves open: rewards are expected in `[0, 1]` (the affine map is applied as is to fractional
    rewards, giving `A ∈ [-1, 1]`); rewards outside `[0, 1]` raise, since `2r - 1` then has no reference meaning;
    NaN rewards (unscored) give 0.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards in `[0, 1]`.
        group_size (`int`): `G` (unused: the advantage is per rollout).

    Returns:
        `torch.Tensor`: `(N,)` advantages in `[-1, 1]`.
    """
    finite = rewards[~torch.isnan(rewards)]
    if finite.numel() and (finite.min() < 0 or finite.max() > 1):
        raise ValueError(
            "advantage_estimator='sign_adv' expects rewards in [0, 1] (binary correctness); got values in "
            f"[{finite.min().item():g}, {finite.max().item():g}]. Rescale the reward functions or use "
            "advantage_estimator='grpo'."
        )
    return torch.nan_to_num(2.0 * rewards - 1.0, nan=0.0)
