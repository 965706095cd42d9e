"""SRPO (Sample-Routed Policy Optimization): correct rollouts train with GRPO's clipped policy gradient, failed
rollouts that have a correct sibling in their group train with SDPO's logit-level self-distillation from a
self-teacher, weighted per token by the teacher's confidence; both per-token losses share one denominator.

Per rollout `i` with reward `r_i` (weighted sum of the reward functions) and group `g(i)`:

    correct_i  = r_i ≥ τ                                            (τ = srpo_success_threshold, 1.0: r = 1)
    routed_i   = not correct_i  and  ∃ j ∈ g(i), j ≠ i: correct_j    (NaN rewards: neither correct nor routed)

    l_it = clip(ρ_it, A_i)                    if not routed_i   (GRPO's surrogate −min(ρA, clip(ρ, 1−ε, 1+ε_h)A))
    l_it = w_it · D_α(π_θ(·|x, y_<t) ‖ π_T(·|x', y_<t))   if routed_i

where `x'` is the prompt re-written with a correct sibling's completion (SDPO's teacher prompt, built by TRL's
`SuccessfulRolloutTeacherContextBuilder`), `π_T` the self-teacher (the policy's EMA, rate 0.05, by default), and

    D_α = SDPO's generalised Jensen-Shannon divergence on the teacher's top-k support plus a tail bucket
          (α = srpo_distill_alpha = 0.5: the symmetric JS, ½KL(π_θ‖M) + ½KL(π_T‖M), M = ½π_θ + ½π_T;
          k = srpo_distill_topk = 100)
    w_it = exp(−β H_T,it) / mean_{routed loss tokens of the generation batch} exp(−β H_T)   (β = srpo_entropy_beta = 1)

with `H_T,it` the self-teacher's full-vocabulary entropy at position `t` (temperature-scaled): confident teacher
targets weigh more, high-entropy ones less, and the weights average 1 over the distillation tokens so that the
distillation term keeps its scale. The per-token losses of both routes then go through one aggregation (the run's
`loss_aggregation`, `global_token_mean` by default: Σ of both terms over every loss token of the generation batch,
divided by their total count — the shared token denominator). A group with no correct rollout is GRPO's; a group
where every rollout is correct has advantage 0 everywhere (GRPO's zero gradient); rows routed to distillation get no
policy-gradient term, correct rows no distillation term.

Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`;
`ctx.self_distill` (`trl_groupx.objective.self_teacher.SelfDistillBatch`): `routed (B,)` bool, `weights (B, T)`,
`teacher_topk_logps` and `student_topk_logps` `(B, T, k)` (the student's with grad), filled by the trainer for
objectives that require `"self_teacher_topk"`; `None` means no row is routed.

Source: the paper (arXiv:2604.02288, §3, as summarised in `shared/catalog.md` and `shared/official-code.md`: route
correct samples to GRPO and failed samples with a successful sibling to SDPO, top-100 JS, EMA teacher 0.05,
w = exp(−βH_teacher) normalised over the distillation tokens, β = 1, shared token denominator); no official code
is public. The SDPO branch reuses trl==1.16.0 `trl/experimental/sdpo`: `loss_utils.compute_divergence` (the
α-interpolated divergence) and `loss_utils.add_tail_bucket`, `sdpo_trainer.SuccessfulRolloutTeacherContextBuilder`
(teacher prompts: the group's first correct completion, `solution_template` and `reprompt_template`, defaults of
`SDPOConfig`), `teacher_sync.PEFTAdapterEMACallback` (LoRA EMA teacher) and `SyncRefModelCallback.sync_target_model`
(full-model EMA teacher).

Choices (the summary of the paper is silent on them):
- Top-k support: the *teacher's* top-k tokens at each position, computed once per generation batch with no grad,
  where TRL's `compute_topk_self_distillation_loss` takes the *student's* top-k (which needs the teacher's full
  logits again at every micro-batch). The student's log-probs are gathered on the same k ids in the loss forward.
- Tail bucket on (`srpo_distill_add_tail=True`): the divergence covers the top-k tokens and the rest of the
  vocabulary as one bucket (verl's SDPO recipe,
  verl-project/verl-recipe@aa72eebe502f83ebabf696b81568961ec8555cb4:sdpo/__init__.py, `SDPOConfig` defaults
  `distillation_add_tail=True`; TRL's `SDPOConfig` defaults to False); `False` renormalises both on the top-k.
- No importance-sampling correction of the distillation term (the same `SDPOConfig`: `is_clip=None`; TRL's SDPO
  clips it at 2): on-policy the ratio is 1 anyway.
- The teacher's entropy is over the full vocabulary, and the weight normalisation is over the routed loss tokens of
  the whole generation batch on all processes (not per micro-batch), so gradient accumulation does not change it.
- The teacher targets (and routing) are computed once per generation batch: with `steps_per_generation > 1` the
  EMA teacher of the generation step is used for all its micro-batches.
- Correct = total reward ≥ 1.0 (the paper's r = 1; `srpo_success_threshold`); a NaN reward is neither correct nor
  routed and keeps GRPO's path, whose advantage there is 0.
- Teacher and student distributions are both taken at the sampling `temperature` (as TRL's SDPO does); the teacher
  prompt follows TRL's `SDPOConfig` templates (the group's first correct completion other than the row itself).
- The catalog's `distill_entropy_weighting=False` is `srpo_entropy_beta=0` (uniform weights).
"""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .surrogates import clipped_surrogate

TEACHER_KINDS = ("ema", "live", "base")


def _validate(config) -> None:
    def number(name: str, low: float, low_ok: bool, high: float | None = None, high_ok: bool = True) -> None:
        value = getattr(config, name)
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        bad = bad or value < low or (value == low and not low_ok)
        bad = bad or (high is not None and (value > high or (value == high and not high_ok)))
        if bad:
            span = f"{'[' if low_ok else '('}{low}, {high if high is not None else 'inf'}{']' if high_ok else ')'}"
            raise ValueError(f"{name} must be a finite number in {span}, got {value!r}.")

    number("srpo_entropy_beta", 0.0, True)
    number("srpo_distill_alpha", 0.0, True, 1.0, True)
    number("srpo_teacher_update_rate", 0.0, False, 1.0, True)
    threshold = config.srpo_success_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"srpo_success_threshold must be a finite number (1.0 = reward 1), got {threshold!r}.")
    topk = config.srpo_distill_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"srpo_distill_topk must be a positive integer (the paper uses 100), got {topk!r}.")
    if config.srpo_teacher_kind not in TEACHER_KINDS:
        raise ValueError(
            f"srpo_teacher_kind must be one of {TEACHER_KINDS} ('ema': the policy's moving average, the default; "
            f"'live': the current policy; 'base': the initial policy), got {config.srpo_teacher_kind!r}."
        )
    if not isinstance(config.srpo_distill_add_tail, bool):
        raise ValueError(f"srpo_distill_add_tail must be True or False, got {config.srpo_distill_add_tail!r}.")


@register(
    "srpo",
    name="SRPO (Sample-Routed Policy Optimization)",
    paper="Sample-Routed Policy Optimization (SRPO), arXiv:2604.02288",
    official_code=None,
    stage="objective",
    flags={"loss_type": "srpo", "loss_aggregation": "global_token_mean"},
    needs=("a verifiable 0/1 reward (a rollout is correct at total reward >= srpo_success_threshold); one no-grad "
           "self-teacher forward per generation batch on the re-prompted failed rollouts",),
    requires=("self_teacher_topk",),
    params=("srpo_success_threshold", "srpo_entropy_beta", "srpo_distill_topk", "srpo_distill_alpha",
            "srpo_distill_add_tail", "srpo_teacher_kind", "srpo_teacher_update_rate"),
    validate=_validate,
)
def srpo_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    importance_sampling_level: str,
    srpo_distill_alpha: float,
    srpo_distill_add_tail: bool,
) -> torch.Tensor:
    """SRPO per-token loss `(B, T)`: GRPO's clipped surrogate on the rows not routed to distillation, the
    entropy-weighted top-k divergence to the self-teacher on the routed rows (see the module docstring)."""
    policy_gradient = clipped_surrogate(ctx, epsilon=epsilon, epsilon_high=epsilon_high, delta=None,
                                        importance_sampling_level=importance_sampling_level)
    batch = ctx.self_distill
    if batch is None or not bool(batch.routed.any()):
        return policy_gradient
    divergence = topk_divergence(batch.student_topk_logps, batch.teacher_topk_logps, alpha=srpo_distill_alpha,
                                 add_tail=srpo_distill_add_tail)
    distill = batch.weights * divergence
    routed = batch.routed[:, None]
    # each term is multiplied by its route (not `torch.where`), so neither route reaches the other's gradient
    return routed * distill + (~routed) * policy_gradient.expand_as(distill)


def topk_divergence(student_topk_logps: torch.Tensor, teacher_topk_logps: torch.Tensor, *, alpha: float,
                    add_tail: bool) -> torch.Tensor:
    """SDPO's divergence `(B, T)` between student and teacher on the teacher's top-k tokens.

    Both inputs are full-vocabulary log-probs `(B, T, k)` of the same k token ids. With `add_tail`, each gets one
    more category, its leftover mass `1 − Σ_k p` (TRL's `add_tail_bucket`); otherwise both are renormalised over the
    k ids. Then TRL's `compute_divergence`: α = 0 forward KL(π_T‖π_θ), α = 1 reverse KL(π_θ‖π_T), else the
    generalised JS `(1−α) KL(π_θ‖M) + α KL(π_T‖M)` with `M = (1−α) π_θ + α π_T`.
    """
    # imported here: trl.experimental warns on import, and only SRPO runs need it
    from trl.experimental.sdpo.loss_utils import add_tail_bucket, compute_divergence

    if add_tail:
        student, teacher = add_tail_bucket(student_topk_logps), add_tail_bucket(teacher_topk_logps)
    else:
        student = student_topk_logps - torch.logsumexp(student_topk_logps, dim=-1, keepdim=True)
        teacher = teacher_topk_logps - torch.logsumexp(teacher_topk_logps, dim=-1, keepdim=True)
    return compute_divergence(student, teacher.to(student.dtype), alpha)


def entropy_weights(teacher_entropy: torch.Tensor, distill_mask: torch.Tensor, beta: float,
                    total: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """SRPO's entropy-aware weights `(N, T)`: `exp(−β H)` on the distillation tokens (`distill_mask` 1), divided by
    its mean over them, 0 elsewhere (entropies there are never read).

    `total`: `(Σ exp(−βH), token count)` over a larger set of distillation tokens (all processes' share of the
    generation batch) to normalise by instead of this tensor's own.
    """
    raw = teacher_confidence(teacher_entropy, distill_mask, beta)
    weight_sum, count = total if total is not None else (raw.sum(), (distill_mask > 0).sum())
    if float(count) == 0:
        return raw
    return raw * (count / weight_sum)


def teacher_confidence(teacher_entropy: torch.Tensor, distill_mask: torch.Tensor, beta: float) -> torch.Tensor:
    """`exp(−β H)` `(N, T)` on the distillation tokens, 0 elsewhere (entropies there are never read)."""
    mask = distill_mask > 0
    return torch.where(mask, torch.exp(-beta * torch.where(mask, teacher_entropy, 0.0)), 0.0)
