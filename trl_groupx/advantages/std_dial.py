"""The GRPO / Dr. GRPO std dial as one explicit flag (group-standard-deviation identity, arXiv:2607.00152)."""

from __future__ import annotations

import torch

from ..registry import register
from ._checks import reject_infinite
from .group_norm import group_normalized_advantages

STD_DIAL_MODES = ("divide", "none")
_TRL_SCALE = {"divide": "group", "none": "none"}


def _validate(config) -> None:
    if config.std_dial_mode not in STD_DIAL_MODES:
        hint = (
            " 'drop_zero' (DAPO: discard groups whose std is 0) removes rollouts from the loss and its normaliser, "
            "which is a sampling-stage filter, not an advantage; it is not available yet."
            if config.std_dial_mode == "drop_zero" else ""
        )
        raise ValueError(f"std_dial_mode must be one of {list(STD_DIAL_MODES)}, got {config.std_dial_mode!r}.{hint}")


@register(
    "std_dial",
    name="GRPO / Dr. GRPO / DAPO as one std dial",
    paper="GRPO, Dr. GRPO, and DAPO Are Three Operations on One Number: The Group-Standard-Deviation Identity, "
    "arXiv:2607.00152",
    official_code=None,
    stage="advantages",
    flags={"advantage_estimator": "std_dial", "std_dial_mode": "divide"},
    params=("std_dial_mode",),
    validate=_validate,
)
def std_dial_advantages(rewards: torch.Tensor, group_size: int, *, std_dial_mode: str = "divide") -> torch.Tensor:
    """The std dial: centre on the group mean, then divide by the group std (`"divide"`) or not (`"none"`).

    `"divide"`: `A_i = (r_i − mean_g) / (std_g + 1e-4)` — GRPO, identical bit for bit to TRL's
    `scale_rewards="group"` (the default, `advantage_estimator="grpo"`).
    `"none"`: `A_i = r_i − mean_g` — Dr. GRPO, identical bit for bit to TRL's `scale_rewards="none"`.
    Both are `trl_groupx.advantages.group_norm.group_normalized_advantages` (TRL's formula, unbiased std, eps 1e-4).

    The paper (arXiv:2607.00152; its code/data link was not available here, so no code was read) shows that for
    0/1 rewards in a group with success rate `p = k/G` the std is the size of the update (the
    group-standard-deviation identity): under `"none"` the advantage vector has
    `Σ_i A_i² = (G − 1)·std_g²` (largest for an even split, zero for a unanimous group), under `"divide"` it is
    `(G − 1)·(std_g/(std_g + ε))² ≈ G − 1` for every mixed group, whatever `p`. DAPO's dynamic sampling, the third
    setting (`"drop_zero"`: discard groups with `std_g = 0`), changes which rollouts enter the loss and its
    normaliser rather than the advantages (a unanimous group already gets advantage 0 in both settings above), so
    it belongs to the sampling stage and is not offered here; asking for it raises a `ValueError` that says so.
    TRL's `scale_rewards="batch"` (batch std) is outside the paper's dial and stays a TRL flag.

    Why a variant at all, when TRL's `scale_rewards` already is the dial: it names the paper's setting explicitly
    (`std_dial_mode`), and recipes can switch it on. NaN rewards are left out of mean and std and get 0; ±inf
    rewards raise a `ValueError`; `G = 1` gives 0 (no group to compare with).

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.
        std_dial_mode (`str`): `"divide"` (GRPO) or `"none"` (Dr. GRPO).

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    if std_dial_mode not in STD_DIAL_MODES:
        raise ValueError(f"std_dial_mode must be one of {list(STD_DIAL_MODES)}, got {std_dial_mode!r}.")
    reject_infinite(rewards, "std_dial")
    return group_normalized_advantages(rewards, group_size, scale_rewards=_TRL_SCALE[std_dial_mode])
