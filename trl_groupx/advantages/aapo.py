"""AAPO (Advantage-Augmented Policy Optimization): GRPO advantages plus a clipped reward margin over a sample of
the frozen reference model (arXiv:2505.14264).

Dispatched with `advantage_estimator="aapo"` (requires `reference_sample_rewards`: the trainer samples one
completion per rollout from the reference model — the base model under the LoRA adapter, or TRL's `ref_model` when
`beta > 0` — and scores it, see `trl_groupx/sampling/baseline_rollouts.py`).
"""

from __future__ import annotations

import math

import torch

from ..registry import register
from ..sampling.baseline_rollouts import reject_vllm
from ._checks import reject_infinite
from .group_norm import group_normalized_advantages

# official `std + 1e-4` when scale_rewards is on (TRL's epsilon)
STD_EPS = 1e-4


def _validate(config) -> None:
    reject_vllm(config, "aapo")
    low, high, coef = config.aapo_clip_low, config.aapo_clip_high, config.aapo_coef
    for name, value in (("aapo_clip_low", low), ("aapo_clip_high", high), ("aapo_coef", coef)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0 (official: clip 0.2 / 0.28, coef 1), got {value!r}.")


@register(
    "aapo",
    name="AAPO (Advantage-Augmented Policy Optimization)",
    paper="AAPO: Enhancing the Reasoning Capabilities of LLMs with Advantage Margin, arXiv:2505.14264",
    official_code="JianxXiong/AAPO@83f0b4cbae92d90744e8d811337d9b4edd411ec7:open-r1/trainer/AAPOTrainer.py",
    stage="advantages",
    flags={
        "advantage_estimator": "aapo",
        "aapo_clip_low": 0.2,
        "aapo_clip_high": 0.28,
        "aapo_coef": 1.0,
        "aapo_scale_rewards": False,
    },
    params=("aapo_clip_low", "aapo_clip_high", "aapo_coef", "aapo_scale_rewards"),
    requires=("reference_sample_rewards",),
    needs=("one extra sample per rollout from the reference model (LoRA: the base with the adapter disabled; full "
           "fine-tuning: beta > 0 so that TRL loads a ref_model), scored by the run's reward functions",),
    validate=_validate,
)
def aapo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    reference_sample_rewards: torch.Tensor,
    aapo_clip_low: float = 0.2,
    aapo_clip_high: float = 0.28,
    aapo_coef: float = 1.0,
    aapo_scale_rewards: bool = False,
) -> torch.Tensor:
    """AAPO advantage `A_i = Â_i + c · clip(r_i − r_i^ref, −δ_low, δ_high)`.

        Â_i     = r_i − mean_g(r)                (÷ (std_g(r) + 1e-4) with `aapo_scale_rewards`)   GRPO part
        r_i^ref = reward of a completion sampled from the frozen reference policy for rollout i's prompt
        δ_low = 0.2, δ_high = 0.28, c = 1 (official)

    The margin term ("advantage momentum" in the paper's first version) keeps the update alive when a group is
    all-equal (`Â = 0`): such a group still moves towards (away from) answers better (worse) than the reference's.
    `c = 0` gives GRPO's advantages.

    Official code: JianxXiong/AAPO@83f0b4cbae92d90744e8d811337d9b4edd411ec7, `open-r1/trainer/AAPOTrainer.py`:
    `_generate_and_score_completions` (one reference completion per rollout row, scored with the same reward
    functions and weights; `advantage_constrain = rewards − ref_rewards`; group-centred advantages, divided by
    `std + 1e-4` only under `scale_rewards`, off in the 7B scripts) and `compute_loss` (`advantages +
    clamp(advantage_constrain, −0.2, 0.28)`, loss `−log π · A` token-mean, no ratio, clip or KL). The loss is the
    objective stage's business: the recipe pairs this estimator with a ratio-free REINFORCE objective (`gpg`).
    The official code also samples at `G = 6` with `lr 1e-6`; see `recipes/aapo.yaml`.

    Choices: the margin is added in the advantage stage (the official code adds it in the loss; the loss is linear
    in the advantage, so the update is the same). `aapo_coef` is ours (1 = official) so the margin term can be
    dialled down to GRPO. NaN rewards get 0; a NaN reference reward (unscorable reference sample) contributes no
    margin. `G = 1`: `Â = 0`, only the margin remains.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G`.
        reference_sample_rewards (`torch.Tensor`): `(N,)` reward of each rollout's reference sample, NaN where
            unscorable.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "aapo")
    reject_infinite(reference_sample_rewards, "aapo")
    if reference_sample_rewards.shape != rewards.shape:
        raise ValueError(f"aapo: reference_sample_rewards has shape {tuple(reference_sample_rewards.shape)}, "
                         f"expected {tuple(rewards.shape)} (one reference sample per rollout).")
    base = group_normalized_advantages(
        rewards, group_size, scale_rewards="group" if aapo_scale_rewards else "none", eps=STD_EPS)
    margin = (rewards - reference_sample_rewards.to(rewards)).clamp(-aapo_clip_low, aapo_clip_high)
    advantages = base + aapo_coef * torch.nan_to_num(margin, nan=0.0)
    return torch.where(torch.isnan(rewards), torch.zeros_like(advantages), advantages)
