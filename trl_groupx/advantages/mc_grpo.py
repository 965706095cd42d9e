"""MC-GRPO: the group median as baseline over G+1 rollouts, the median rollout (pivot) left out of the update."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register

MC_GRPO_SCALES = ("mad", "none")


def _validate(config) -> None:
    if config.num_generations % 2 == 0:
        raise ValueError(
            f"advantage_estimator='mc_grpo' needs an odd group (G+1 rollouts, one median pivot); num_generations="
            f"{config.num_generations} is even. Set num_generations to G+1, e.g. {config.num_generations + 1}."
        )
    if config.mc_grpo_scale not in MC_GRPO_SCALES:
        raise ValueError(f"mc_grpo_scale must be one of {MC_GRPO_SCALES}, got {config.mc_grpo_scale!r}.")


@register(
    "mc_grpo",
    name="MC-GRPO (Median-Centered GRPO)",
    paper="MC-GRPO: Median-Centered Group Relative Policy Optimization for Small-Rollout Reinforcement Learning, "
    "arXiv:2601.22582",
    official_code="lotusroot-kim/MC-GRPO@da077455d4cb:src/open_r1/grpo_trainer_math.py",
    stage="advantages",
    # G+1 = 9 (official scripts: G = 8); 72 = 8 prompts of 9 rollouts, divisible by TRL's default batch of 8
    flags={"advantage_estimator": "mc_grpo", "num_generations": 9, "generation_batch_size": 72, "mc_grpo_scale": "mad"},
    params=("mc_grpo_scale",),
    validate=_validate,
)
def mc_grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, mc_grpo_scale: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Median-centred advantages over odd groups of `G+1` rollouts, and the keep mask that drops each group's pivot.

    `A_i = (r_i − med_g) / (MAD_g + 1e-3)`, `MAD_g = med_j |r_j − med_g|` (`mc_grpo_scale="mad"`, the official code:
    lotusroot-kim/MC-GRPO@da077455d4cb:src/open_r1/grpo_trainer_math.py:_generate_and_score_completions
    l.2026–2066, which then skips the std division in training), or `A_i = r_i − med_g` (`"none"`: the abstract's
    "advantages by using the group median", with no scale). With an odd group exactly one rollout is the median; it
    has `A = 0` and is excluded from backpropagation, so `G` rollouts per prompt contribute (l.2095–2120).

    Shapes: `rewards (N,)`, `N` a multiple of `group_size` (odd). Returns `(advantages (N,), keep (N,) bool)`.

    Choices and differences from the official code:
    - Pivot: the lowest-index rollout whose reward equals the median (torch's `median` index is unspecified on ties).
    - Binary rewards make `MAD = 0` in every odd group (the majority value is the median), so `"mad"` gives
      `A = ±gap/1e-3` (±1000× the reward gap) on the minority rollouts and 0 on the majority: the official
      behaviour; Adam's normalisation absorbs most of the scale, gradient clipping does not. `"none"` avoids it.
    - The pivot is masked (zero loss tokens) rather than removed, so TRL's `grpo` sequence mean still divides by
      `G+1` rows (a constant `(G+1)/G` factor); token-normalised losses (`dapo`, `bnpo`) are exact.
    - The official code appends the extra rollout per device and takes medians over contiguous blocks, which mixes
      prompts when a device holds more than one (see ../shared/official-code.md); here groups are TRL's, intact.
    - NaN rewards (unscored) get 0, are left out of the median and MAD, and are never the pivot; a group with no
      scored rollout has no pivot.
    """
    if mc_grpo_scale not in MC_GRPO_SCALES:
        raise ValueError(f"mc_grpo_scale must be one of {MC_GRPO_SCALES}, got {mc_grpo_scale!r}.")
    r = grouped(rewards, group_size)  # (groups, G+1)
    if torch.isinf(r).any():
        raise ValueError("advantage_estimator='mc_grpo' got an infinite reward; rewards must be finite or None.")
    median = torch.nanmedian(r, dim=1, keepdim=True).values
    advantages = r - median
    if mc_grpo_scale == "mad":
        mad = torch.nanmedian((r - median).abs(), dim=1, keepdim=True).values
        advantages = advantages / (mad + 1e-3)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    # pivot: first scored rollout equal to the median (argmax of a bool picks the first True)
    at_median = (r == median) & ~torch.isnan(r)
    pivot = torch.zeros_like(at_median)
    has_pivot = at_median.any(dim=1)
    pivot[has_pivot, at_median[has_pivot].float().argmax(dim=1)] = True
    return advantages.reshape(-1), ~pivot.reshape(-1)
