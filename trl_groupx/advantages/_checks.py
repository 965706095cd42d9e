"""Input guards shared by the advantage variants of this stage (no variant lives here)."""

from __future__ import annotations

import torch


def reject_infinite(rewards: torch.Tensor, variant_id: str) -> None:
    """Raise a `ValueError` naming the flag when a reward is `±inf` (NaN is allowed: it marks an unscored rollout)."""
    if torch.isinf(rewards).any():
        raise ValueError(
            f"advantage_estimator={variant_id!r} got an infinite reward; rewards must be finite (NaN marks an "
            "unscored rollout). Fix or clip the reward function, or use another advantage_estimator."
        )


def reject_outside_unit_interval(rewards: torch.Tensor, variant_id: str, why: str) -> None:
    """Raise a `ValueError` naming the flag when a scored reward lies outside `[0, 1]`."""
    finite = rewards[~torch.isnan(rewards)]
    if finite.numel() and (finite.min() < 0 or finite.max() > 1):
        raise ValueError(
            f"advantage_estimator={variant_id!r} expects rewards in [0, 1] ({why}); got values in "
            f"[{finite.min().item():g}, {finite.max().item():g}]. Rescale the reward functions (reward_weights) or "
            "use another advantage_estimator."
        )
