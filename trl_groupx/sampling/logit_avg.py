r"""Logit-averaged reference anchoring (`rollout_filter="logit_avg"`): the acting policy's logits are a weighted
average of the trainable policy's and a frozen reference's, and GRPO runs on that mixed policy, with no KL term and
no critic.

arXiv:2605.20555 ("averages the logits of a frozen reference policy (e.g., SFT) and a trainable policy, and
incorporate[s] the method into GRPO ... does not involve a KL regularization or critic; the trainable policy and the
reference anchor are coupled through the logit averaging structure"). No official code is published
(`/work/shared/official-code.md`: none); the formula is the paper's `z = ½ (z_ref + z_θ)`, β = 0.

Formula, per position `t` of a completion (logits `(V,)`, before temperature):

    z_mix = α · z_θ + (1 − α) · z_ref          (α = logit_avg_alpha, ½ in the paper)
    log π_mix(y_t | ·) = log_softmax(z_mix / T)[y_t]

so `∂ z_mix / ∂ z_θ = α` and the reference receives no gradient (it is frozen). Every GRPO quantity that TRL computes
from the policy's log-probs (the ratio's old and current log-probs, entropies, the token stage's log-probs) is
computed from `π_mix`, and rollouts are sampled from `π_mix`, so the update is on-policy for the mixed policy.

Shapes: logits `(B, T, V)` (training) or `(B, V)` (one decoding step); log-probs and entropies `(B, T)`.

Here (`trl_groupx/sampling/logit_averaging.py`):
- Reference: with a LoRA adapter, the base model with the adapter disabled (TRL's `ref` adapter when the model
  already carried one); in full fine-tuning, a frozen copy of the policy taken when the trainer is built (TRL loads
  no `ref_model` when `beta=0`, which this variant requires).
- Training: the trainer's log-prob method runs the policy forward (with grad) and a no-grad reference forward on the
  same rows, mixes the logits, and takes `log_softmax(z_mix / T)` at TRL's `temperature`.
- Generation (transformers `generate`, TRL's `_generate_single_turn`): a logits processor runs the reference on the
  tokens generated so far with its own KV cache and replaces each step's scores by `z_mix`; transformers'
  temperature / top-k / top-p warpers then act on `z_mix` as they would on the policy's logits.

Choices (the paper leaves them open):
- α is a field (`logit_avg_alpha`, default ½ = the paper's average); α in (0, 1]. α = 1 is plain GRPO; α = 0 would
  leave nothing to train and is refused.
- The mix is of the raw logits (after the model's own logit scaling / soft-capping, before temperature), and the
  temperature divides the mix, so sampling and the loss see the same distribution.
- Generation penalties (e.g. `repetition_penalty`) act on the policy's scores before the mix (transformers runs its
  own processors before custom ones); TRL's defaults have none.
- Evaluation generations are sampled from the mixed policy too (it is the acting policy). The saved weights are the
  trainable policy's only: deploying the trained policy means averaging with the same reference.
- `beta` must be 0 (the paper's point: the average replaces the KL anchor).

Scope: transformers generation only (vLLM and continuous batching are refused: the reference cannot enter their
sampling); a `rollout_func`, tools and environments are refused at construction; so are the options whose forwards
bypass the mixed log-prob path (see `validate`). The training forward holds full `(B, T, V)` logits for both models
per micro-batch (`logps_chunk_size` is refused), and a full-fine-tuning run holds a second copy of the weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register
from ._exclusive import refuse_bypasses, refuse_own_forwards

VARIANT_ID = "logit_avg"
ALPHA = "logit_avg_alpha"
# Inputs computed by forwards of their own (not through the mixed log-prob path), or that generate with another
# policy (the extra baseline completions of remax / aapo).
_OWN_FORWARD_REQUIREMENTS = ("ref_logps", "sum_pi_squared", "tempered_logps", "intra_group_token_divergence",
                             "contrast_logps", "prompt_kl", "self_teacher_topk", "answer_belief",
                             "greedy_baseline_rewards", "reference_sample_rewards")


def validate(config: Any) -> None:
    """Config-time checks of `logit_avg_alpha`, `beta` and of the generation and log-prob paths."""
    alpha = getattr(config, ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha) and 0 < alpha <= 1):
        raise ValueError(f"{ALPHA}={alpha!r}: use a weight in (0, 1] of the trainable policy's logits in the mix "
                         "α·z_θ + (1−α)·z_ref (paper: 0.5; 1 = plain GRPO; 0 would train nothing).")
    if config.beta != 0:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} anchors the policy by the logit average instead of a KL term "
                         f"(the paper uses no KL): set beta=0 (got beta={config.beta!r}).")
    refused = {"use_vllm": "vLLM's sampler", "use_transformers_continuous_batching": "continuous batching",
               "use_liger_kernel": "the Liger loss's own forward", "prefix_grouper": "the shared-prefix forward",
               "logps_chunk_size": "the chunked LM-head forward", "edge_grpo_gec": "GEC's own generation"}
    refuse_bypasses(config, VARIANT_ID, refused, "mixes the reference's logits into transformers' generate and into "
                    "the trainer's log-prob forward", "bypasses")
    refuse_own_forwards(config, _OWN_FORWARD_REQUIREMENTS, f"use rollout_filter={VARIANT_ID!r}'s mixed policy")


def mixed_logits(policy_logits: torch.Tensor, reference_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """`α · z_θ + (1 − α) · z_ref` in float32; any matching shapes (`(B, V)` or `(B, T, V)`). The gradient reaches
    `policy_logits` only, scaled by α."""
    return alpha * policy_logits.float() + (1.0 - alpha) * reference_logits.detach().float()


def mixed_token_logps(
    policy_logits: torch.Tensor, reference_logits: torch.Tensor, targets: torch.Tensor, *, alpha: float,
    temperature: float = 1.0, compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` `(B, T)` under `softmax(z_mix / T)` from `(B, T, V)` logits, and the entropies of that
    distribution when asked; both `(B, T)` float32."""
    z = mixed_logits(policy_logits, reference_logits, alpha)
    if temperature != 1.0:
        z = z / temperature
    logp_all = z.log_softmax(-1)
    logps = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
    return logps, entropies


@register(
    VARIANT_ID,
    name="Logit-averaged reference anchoring: GRPO on the average of the policy's and a frozen reference's logits",
    paper="Logit averaging of a frozen reference and a trainable policy in GRPO, arXiv:2605.20555",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, ALPHA: 0.5, "beta": 0.0},
    params=(ALPHA,),
    validate=validate,
)
def logit_avg(batch: RolloutBatch) -> torch.Tensor:
    """Logit averaging changes the policy that samples and is scored (module docstring), not which rollouts are
    kept: this is the stage's filter and keeps every rollout, so the variant composes with the advantage estimators,
    token weightings and objectives whose inputs come through the mixed log-prob path, not with another
    `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch of rollouts.

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
