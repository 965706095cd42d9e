"""SoftmaxGRPO: temperature-scaled softmax advantages over the group (arXiv:2608.09271)."""

from __future__ import annotations

import math

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite


def _validate(config) -> None:
    tau = config.softmax_grpo_temperature
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ValueError(
            f"softmax_grpo_temperature must be a finite number > 0, got {tau!r}; the paper uses 0.3 (0.1 on "
            "GSM8K/Countdown)."
        )


@register(
    "softmax_grpo",
    name="SoftmaxGRPO (Softmax Advantage Group Estimation)",
    paper="SoftmaxGRPO: Learning to Reason using Softmax Advantage Group Estimation, arXiv:2608.09271",
    official_code="jeffhernandez1995/softmaxgrpo@088c87cfa0b1b13faa0d377095d66c961ca87893:softmaxgrpo/advantage.py",
    stage="advantages",
    flags={"advantage_estimator": "softmax_grpo", "softmax_grpo_temperature": 0.3},
    params=("softmax_grpo_temperature",),
    validate=_validate,
    bibtex=(
        "@inproceedings{hernandez2026softmaxgrpo,\n  title={SoftmaxGRPO: Learning to Reason using Softmax Advantage "
        "Group Estimation},\n  author={Hernandez, Jefferson and Koo, Jaywon and Xiao, Zilin and Wei, Chen and "
        "Ordonez, Vicente},\n  booktitle={COLM},\n  year={2026}\n}"
    ),
)
def softmax_grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, softmax_grpo_temperature: float = 0.3
) -> torch.Tensor:
    """SoftmaxGRPO advantage: `A_i = M · softmax(r / τ)_i − 1` within each group.

    For a group with `M` scored rollouts and rewards `r_1..r_M`,
    `w_i = exp(r_i / τ) / Σ_j exp(r_j / τ)` (weights in `[0, 1]`, summing to 1) and `A_i = M · w_i − 1`, so the
    advantages of a group sum to zero, lie in `[−1, M − 1]` and need no std division. An all-equal group gets
    uniform weights `1/M`, hence advantage 0; `τ → 0` puts all weight on the argmax rewards (MaxRL limit).
    Example: one success among 8 at τ = 0.3 gets `8·e^{1/0.3}/(e^{1/0.3}+7) − 1 ≈ 5.40`; each failure gets
    `8/(e^{1/0.3}+7) − 1 ≈ −0.77`.

    Official code: jeffhernandez1995/softmaxgrpo@088c87cfa0b1b13faa0d377095d66c961ca87893,
    `softmaxgrpo/advantage.py:softmax_advantages` (l.9-26; verl adapter `compute_outcome_advantage` l.29-48). As
    there, the group maximum is subtracted before dividing by τ (no overflow at small τ) and the computation runs
    in at least float32 (float64 inputs stay float64). The paper's default τ = 0.3 (DeepMath, OpenThoughts,
    Qwen3 configs); the GSM8K/Countdown configs use 0.1.

    Choices the official code leaves open (it raises on any non-finite reward): NaN rewards (unscored rollouts)
    are left out of the softmax — they get weight 0 and advantage 0 — and `M` is the number of *scored* rollouts
    of the group, so the scored members still sum to zero; an all-NaN group gets 0. ±inf rewards raise a
    `ValueError`. A group of one (`G = 1`, or one scored member) gets `1·1 − 1 = 0`, as in the official code.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.
        softmax_grpo_temperature (`float`): τ > 0.

    Returns:
        `torch.Tensor`: `(N,)` advantages, dtype of `rewards` (computed in ≥ float32).
    """
    reject_infinite(rewards, "softmax_grpo")
    work = rewards.detach().to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    by_group = grouped(work, group_size)  # (N/G, G)
    scored = ~torch.isnan(by_group)
    neg_inf = torch.full_like(by_group, -math.inf)
    group_max = torch.where(scored, by_group, neg_inf).amax(dim=1, keepdim=True)
    group_max = torch.where(torch.isfinite(group_max), group_max, torch.zeros_like(group_max))  # all-NaN group
    logits = torch.where(scored, (by_group - group_max) / softmax_grpo_temperature, neg_inf)
    weights = torch.softmax(logits, dim=1)  # NaN rows only for all-NaN groups
    m = scored.sum(dim=1, keepdim=True).to(work.dtype)
    adv = torch.where(scored, m * weights - 1.0, torch.zeros_like(weights))
    return torch.nan_to_num(adv, nan=0.0).reshape(rewards.shape).to(rewards.dtype)
