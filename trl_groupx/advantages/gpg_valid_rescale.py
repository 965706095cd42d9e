"""GPG's advantage side: group-mean advantages rescaled by the inverse fraction of valid groups (adjust_gd)."""

from __future__ import annotations

import math

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite

# official `(std + 1e-4)` when scale_rewards is on
STD_EPS = 1e-4


def _validate(config) -> None:
    v = config.gpg_valid_rescale_min_inverse_alpha
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 1):
        raise ValueError(
            f"gpg_valid_rescale_min_inverse_alpha must lie in (0, 1] (official 0.5, i.e. alpha <= 2), got {v!r}."
        )


@register(
    "gpg_valid_rescale",
    name="GPG valid-group rescaling (A = (r − mean_g) · B/(B − M), adjust_gd)",
    paper="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, arXiv:2504.02546",
    official_code="AMAP-ML/GPG@e096da8ce527a1636272469cee383ba71ec4a511:open-r1/src/open_r1/gpg_trainer.py",
    stage="advantages",
    flags={
        "advantage_estimator": "gpg_valid_rescale",
        "gpg_valid_rescale_min_inverse_alpha": 0.5,
        "gpg_valid_rescale_scale_rewards": False,
    },
    params=("gpg_valid_rescale_min_inverse_alpha", "gpg_valid_rescale_scale_rewards"),
    validate=_validate,
)
def gpg_valid_rescale_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    gpg_valid_rescale_min_inverse_alpha: float = 0.5,
    gpg_valid_rescale_scale_rewards: bool = False,
) -> torch.Tensor:
    """GPG advantage with the valid-group gradient rescaling: `A_i = (r_i − mean_g) · α`, `α = B / (B − M)`.

    `B` is the number of groups in the (global) batch and `M` the number of groups whose rewards have zero spread
    (all-equal groups, which give zero advantage and so dilute the batch-mean gradient). Rescaling by
    `α = 1/inverse_alpha`, `inverse_alpha = (B − M)/B`, restores the gradient scale of the valid groups (GPG §3.2).
    `α` is capped at `1 / gpg_valid_rescale_min_inverse_alpha` (official 0.5 → α ≤ 2). With
    `gpg_valid_rescale_scale_rewards=True` the centred rewards are also divided by the group's unbiased std + 1e-4
    (official `--scale_rewards`; the official scripts use `False`).

    Official code: AMAP-ML/GPG@e096da8ce527a1636272469cee383ba71ec4a511,
    `open-r1/src/open_r1/gpg_trainer.py`: `_generate_and_score_completions` l.320-626 (zero-std groups counted
    l.542-554 on the gathered batch, resampling loop l.333-610, `A = r − mean` l.614-623,
    `inverse_alpha = min(1, n_valid / num_groups)` l.625-626) and `compute_loss` l.269-318 (`loss /= inverse_alpha`
    under `--adjust_gd`, l.315-316); `--min_inverse_alpha 0.5` in `open-r1/train.sh`, default in `configs.py` l.68.

    Where α applies, and the cap: the official code divides the *loss* by `inverse_alpha`; the loss is linear in
    `A`, so this equals multiplying the advantages by α — exactly so when there is no KL term (GPG has `beta = 0`);
    with `beta ≠ 0` the official division also scales the KL term, which here stays unscaled. `min_inverse_alpha` is
    not a cap in the official code: it is the threshold of the resampling loop (keep generating batches and
    collecting valid groups until `n_valid ≥ min_inverse_alpha · B`), which is what keeps α ≤ 1/min_inverse_alpha
    there. That resampling loop is a sampling-stage feature and is **not provided here**; instead, with the batch
    as generated, α is clamped to `1/min_inverse_alpha` so the gradient scale stays in the official range.

    Other choices: a group is valid when its scored rewards are not all equal (official `std == 0` test). NaN
    rewards (unscored) are left out of the group mean and of the validity test and get 0; a group with fewer than
    two scored rollouts (including `G = 1`) is invalid (the official `std` of one element is NaN, which its
    `== 0` test counts as valid — irrelevant there because such groups have zero advantage). A batch with no valid
    group gets all zeros. ±inf rewards raise a `ValueError`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "gpg_valid_rescale")
    work = rewards.detach().to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    by_group = grouped(work, group_size)  # (B, G)
    scored = ~torch.isnan(by_group)
    m = scored.sum(dim=1, keepdim=True)
    filled = torch.where(scored, by_group, torch.zeros_like(by_group))
    mean = filled.sum(dim=1, keepdim=True) / m.clamp_min(1)
    hi = torch.where(scored, by_group, torch.full_like(by_group, -math.inf)).amax(dim=1)
    lo = torch.where(scored, by_group, torch.full_like(by_group, math.inf)).amin(dim=1)
    valid = (m.squeeze(1) >= 2) & (hi > lo)
    adv = torch.where(scored, filled - mean, torch.zeros_like(filled))
    if gpg_valid_rescale_scale_rewards:
        var = (adv**2).sum(dim=1, keepdim=True) / (m - 1).clamp_min(1)
        adv = adv / (var.sqrt() + STD_EPS)
    n_groups = by_group.shape[0]
    n_valid = int(valid.sum())
    if n_valid == 0:
        return torch.zeros_like(rewards)
    inverse_alpha = max(n_valid / n_groups, gpg_valid_rescale_min_inverse_alpha)
    adv = adv / inverse_alpha
    adv = torch.where(valid.unsqueeze(1) & scored, adv, torch.zeros_like(adv))
    return adv.reshape(rewards.shape).to(rewards.dtype)
