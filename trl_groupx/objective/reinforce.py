"""REINFORCE-style objectives: no importance ratio, no clipping. GPG (arXiv:2504.02546) and RGRA
(arXiv:2603.18756) share the surrogate and differ in advantages, KL and aggregation (their `flags`)."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register


@register(
    "gpg",
    name="GPG (Group Policy Gradient)",
    paper="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, arXiv:2504.02546",
    official_code="AMAP-ML/GPG@e096da8ce527a1636272469cee383ba71ec4a511:open-r1/src/open_r1/gpg_trainer.py",
    stage="objective",
    flags={"loss_type": "gpg", "scale_rewards": "none", "beta": 0.0, "loss_aggregation": "global_token_mean"},
)
def reinforce_surrogate(ctx: ObjectiveContext) -> torch.Tensor:
    """REINFORCE surrogate: `l_t = -A_t · logp_t` per token, `(B, T)` (GPG, RGRA).

    The gradient is `∂l_t/∂logp_t = -A_t`, whatever the rollout policy: no ratio `π/π_old`, no clipping, so
    `ctx.old_logps` is never read. On-policy (`π = π_old`) this is exactly GRPO's gradient (the clipped surrogate's
    derivative at ρ = 1 is `-A_t ρ_t = -A_t`); off-policy (`num_iterations > 1`) it is the plain score-function
    gradient at the current policy (the official code does the same: its ratio/clip lines are commented out).

    GPG (`loss_type="gpg"`, official `GPGTrainer.compute_loss` l.269-318: surrogate l.299, token mean l.303):
    advantages `A = r - mean_g(r)` with no std division (TRL's `scale_rewards="none"`, which the flags set), no
    reference model and no KL (`beta=0`), and a token-level mean. Choices: the aggregation defaults to
    `global_token_mean` (Σ over all tokens of the accumulation window / their number), which is the official per-device
    `Σ l m / Σ m` when one micro-batch holds the whole batch and, unlike it, does not depend on how gradient
    accumulation splits the batch; `loss_aggregation="token_mean"` gives the official per-micro-batch normaliser. Not
    done here (advantage-stage parts of GPG): the valid-group rescaling `α = B / (B - M)` for `B` groups of which `M`
    have zero reward std (official `adjust_gd`: the loss is divided by `inverse_alpha = (B - M) / B`, l.625-626 and
    l.315-316) and the resampling loop that draws more groups until `min_inverse_alpha = 0.5` of them are valid
    (l.320-626). verl's port (verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9,
    `core_algos.py:compute_policy_loss_gpg` and `compute_gpg_outcome_advantage`) computes the same surrogate; its
    advantage uses `α = bsz / count_nonzero(scores)` (non-zero *rewards*, not valid groups).

    RGRA (`loss_type="rgra"`, arXiv:2603.18756, no public code): "retains group-relative advantage estimation but
    removes PPO-style clipping and policy ratio terms" — so the flags keep GRPO's z-score advantages
    (`scale_rewards="group"`), GRPO's per-sequence mean and its k3 KL to the reference. The KL weight was not
    retrievable from the paper text available here; `beta=0.04` (DeepSeekMath GRPO) is our choice. The trainer adds
    TRL's k3 term; the flags set `use_bias_correction_kl=False` so that it is GRPO's plain k3 and no importance ratio
    re-enters through the KL (TRL's default `True` multiplies k3 by the differentiable ratio; verl's `use_kl_loss`
    adds an unweighted k3 "low_var_kl", clamped to ±10).

    Conventions where TRL and verl differ: no dual clip and no ratio clamp (there is no ratio); `A = r - mean`
    without std is TRL's `scale_rewards="none"` (verl's GPG advantage adds the α rescaling, see above).

    Shapes: `ctx.logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`. Padding positions are
    multiplied by the mask in the aggregation, so their values never reach the loss or the gradient.
    """
    return -ctx.advantages * ctx.logps


register(
    "rgra",
    name="RGRA (REINFORCE with Group Relative Advantage)",
    paper="Are complicated loss functions necessary for teaching LLMs to reason?, arXiv:2603.18756",
    official_code=None,
    stage="objective",
    flags={"loss_type": "rgra", "scale_rewards": "group", "beta": 0.04, "use_bias_correction_kl": False,
           "loss_aggregation": "sequence_mean"},
)(reinforce_surrogate)
