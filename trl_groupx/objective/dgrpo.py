"""dGRPO (Distilled GRPO): GRPO's clipped surrogate plus λ times an on-policy distillation term, the per-token reverse
KL to a frozen teacher on the student's own rollouts, in one loss.

The teacher (`opd_teacher_model`, a model id or local path with the student's tokenizer) is loaded once when the
trainer is built (`load_teacher`), frozen, in eval mode, on the trainer's device; its log-probs of the sampled
tokens are computed once per generation batch with no grad (`teacher_token_logps`) and reach the objective as
`ObjectiveContext.teacher_logps` (requirement `teacher_logps`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .surrogates import clipped_surrogate


def _validate(config) -> None:
    coef = config.opd_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        raise ValueError(
            f"opd_coef must be a finite number >= 0 (the weight λ of the distillation term; 0 = plain GRPO, "
            f"default 1.0), got {coef!r}."
        )
    teacher = config.opd_teacher_model
    if teacher is not None and (not isinstance(teacher, str) or not teacher.strip()):
        raise ValueError(
            "opd_teacher_model must be a model id or a local path (a stronger model with the student's tokenizer), "
            f"or None when opd_coef=0; got {teacher!r}."
        )


@register(
    "dgrpo",
    name="dGRPO (Distilled GRPO)",
    paper="Combining On-Policy Optimization and Distillation for Long-Context Reasoning in Large Language Models, "
          "arXiv:2605.12227",
    official_code=None,
    stage="objective",
    flags={"loss_type": "dgrpo", "opd_coef": 1.0, "loss_aggregation": "sequence_mean"},
    needs=("a teacher model (opd_teacher_model: a stronger causal LM with the student's tokenizer), one no-grad "
           "forward per generation batch",),
    requires=("teacher_logps",),
    params=("opd_teacher_model", "opd_coef"),
    validate=_validate,
)
def dgrpo_surrogate(
    ctx: ObjectiveContext, *, epsilon: float, epsilon_high: float | None, opd_coef: float
) -> torch.Tensor:
    """dGRPO per-token loss `(B, T)`: GRPO's clipped surrogate plus `λ` times the on-policy distillation term.

    With `ρ_t = exp(logp_t − logp_old_t)`, `ε_low = epsilon`, `ε_high = epsilon_high` (or `epsilon`), the rollout
    advantage `A_i` and the teacher's log-prob `logp^T_t` of the same sampled token (same temperature):

        clip(ρ, a)  = −min(ρ a, clip(ρ, 1−ε_low, 1+ε_high) a)                        (GRPO's surrogate, as a loss)
        k1_t        = sg(logp_t) − logp^T_t                                      (sampled reverse-KL estimate)
        l_t         = clip(ρ_t, A_i) + λ · clip(ρ_t, −k1_t)        (λ = opd_coef; k1_t := 0 on padding)

    The distillation term is a policy gradient with per-token reward `−k1_t` (no discounting: each token is
    credited with its own divergence only): on-policy (`ρ = 1`) its value is `k1_t` and its gradient
    `k1_t ∇logp_t`, whose expectation over the student's samples is the gradient of the per-position reverse KL
    `KL(π_θ(·|s_t) ‖ π_T(·|s_t)) = E_{y~π_θ}[log π_θ(y) − log π_T(y)]`. Checks: teacher = student ⇒ `k1 ≡ 0`, the
    term and its gradient vanish and the loss is GRPO's; `λ = 0` ⇒ GRPO exactly (the teacher is then not loaded).

    Aggregation: the added term is normalised with the GRPO term, by the run's `loss_aggregation` (default
    `sequence_mean`, GRPO's `mean_i Σ_t l_it / |o_i|`; `global_token_mean` etc. when set), so `λ` weighs the two terms
    per token alike whatever the normaliser — as verl adds its distillation loss, aggregated with the actor's own
    `loss_agg_mode`, to the policy loss. The trainer's KL to the reference (`beta`), masks and importance-sampling
    correction apply to the sum as to any trl_groupx objective. Padding (mask 0) never enters the term: `k1` is set
    to 0 there before anything is computed from it, so even a non-finite teacher value at a padding position is
    never read. Logged: `groupx/teacher_reverse_kl`, the mean of `k1` over the loss tokens of all processes (the
    distillation term's value on-policy, before `λ`).

    Source: the paper (Moura Ramos, Alves, Martins, arXiv:2605.12227) "augments GRPO with dense guidance from a
    stronger teacher via OPD", "combining outcome-based policy optimization with knowledge distillation in a single
    objective" (abstract; the full text, its λ and its estimator were not available to us); no official code is
    public. Peers read: TRL's on-policy distillation, trl==1.16.0
    `trl/trainer/distillation_trainer.py` (`DistillationTrainer._compute_loss` and `_chunked_divergence_loss`:
    full-vocabulary generalized JSD, `beta=1` reverse KL, both logits divided by the same temperature; l.685-700
    refuse a teacher whose `vocab_size` differs); verl's on-policy distillation,
    verl-project/verl@967bdb1492301aeb806c6501f48414d800770054:verl/trainer/distillation/losses.py
    (`distillation_loss`: with `use_policy_gradient`
    the per-token loss, `loss_mode="k1"` = `log π − log π_T` from `compute_distillation_loss_reverse_kl_estimator`,
    enters the vanilla PPO loss as the advantage `−loss.detach()`; the result is added to the policy loss with
    `distillation_loss_coef`, see
    verl-project/verl@dde94de0d8ca32cb70f48833c34dd894b3e1f9ee:verl/workers/config/distillation.py
    `DistillationLossConfig`: default coefficient 1.0,
    `use_policy_gradient` recommended with k1).

    Choice: the sampled-token estimator in its policy-gradient form (verl's `k1` + `use_policy_gradient`, which
    verl attributes to thinkingmachines.ai/blog/on-policy-distillation), not the full-vocabulary reverse KL
    `Σ_v π_θ(v)(log π_θ(v) − log π_T(v))` that TRL's `DistillationTrainer` backpropagates directly. It is dense (one
    term per completion token) and needs only the teacher's log-prob of each sampled token: one no-grad teacher
    forward per generation batch, stored as a `(B, T)` tensor, whereas the full-vocabulary form needs the teacher's
    `(B, T, V)` distribution again at every micro-batch and optimisation pass and the student's full logits with
    grad (TRL needs a tiled kernel for it; our objective contract carries sampled-token log-probs only). Not
    offered as a flag. Further choices (none given by the paper): `λ = 1.0` by default (verl's default
    coefficient); the distillation term is clipped with the run's `epsilon`/`epsilon_high` (verl clips it with its
    own `clip_ratio`, 0.2 by default, the same as GRPO's default here); `k1` uses the current (detached) log-prob,
    so that the term's gradient is the reverse KL's at the current policy also off-policy (on-policy it is the
    rollout's log-prob); no clamp of `k1` (verl's `loss_max_clamp` defaults to 10); the teacher's logits are divided by the same sampling `temperature` as the
    student's, as TRL's distillation trainers do (so teacher = student gives exactly 0); the teacher is loaded in
    the student's dtype.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask`, `ctx.teacher_logps` `(B, T)`; `ctx.advantages` `(B, 1)` or
    `(B, T)`. `ctx.teacher_logps` may be `None` only when `opd_coef == 0`.
    """
    grpo = clipped_surrogate(ctx, epsilon=epsilon, epsilon_high=epsilon_high, delta=None,
                             importance_sampling_level="token")
    if opd_coef == 0:
        return grpo
    if ctx.teacher_logps is None:
        raise ValueError(
            f"loss_type='dgrpo' with opd_coef={opd_coef!r} needs the teacher's log-probs (requirement "
            "'teacher_logps'): set opd_teacher_model, or opd_coef=0 for plain GRPO."
        )
    reverse_kl = sampled_reverse_kl(ctx.logps.detach(), ctx.teacher_logps, ctx.mask)
    # the same surrogate with the advantage −k1 per token
    distill = clipped_surrogate(
        ObjectiveContext(ctx.logps, ctx.old_logps, -reverse_kl, ctx.mask),
        epsilon=epsilon, epsilon_high=epsilon_high, delta=None, importance_sampling_level="token",
    )
    return grpo + opd_coef * distill


def sampled_reverse_kl(logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token sampled reverse-KL estimate `k1 = logp − logp^T` `(B, T)`, 0 where `mask` is 0 (never reading the
    values there, so padding may hold anything, NaN included)."""
    return torch.where(mask > 0, logps - torch.where(mask > 0, teacher_logps, logps), torch.zeros_like(logps))


# ---- the teacher ---------------------------------------------------------------------------------------------------


def load_teacher(trainer: Any) -> torch.nn.Module | None:
    """The frozen teacher of a dGRPO run, or `None` when `opd_coef == 0` (plain GRPO: nothing to load).

    Loaded from `opd_teacher_model` (model id or local path) with TRL's `create_model_from_path`, in the student's
    dtype and attention implementation; checked against the student (same tokenizer vocabulary, a logit width that
    covers every token the student can sample); dropout off when `disable_dropout`; `requires_grad=False`, eval mode;
    given TRL's fused LM head (log-probs without materialising the logits, logits divided by the run's temperature)
    and placed as TRL places its reference model (DeepSpeed, FSDP or `accelerator.prepare_model(evaluation_mode=True)`,
    which puts it on the trainer's device). Raises `ValueError` naming the flag and the fix otherwise.
    """
    args = trainer.args
    path = args.opd_teacher_model
    if args.opd_coef == 0:
        return None
    if path is None:
        raise ValueError(
            f"loss_type='dgrpo' distils from a teacher (opd_coef={args.opd_coef!r}), but opd_teacher_model is not set: "
            "pass the model id or local path of a stronger model with the student's tokenizer, or set opd_coef=0 "
            "for plain GRPO."
        )
    return load_frozen_model(trainer, path)


def load_frozen_model(trainer: Any, path: str, flag: str = "opd_teacher_model",
                      role: str = "teacher", vocab_check: Any = None) -> torch.nn.Module:
    """A frozen second causal LM that scores the policy's sampled tokens (dGRPO's teacher, RTO's DPO model), loaded
    from `path` as `load_teacher` describes; errors name `flag` (the config field that gave `path`) and `role`.
    `vocab_check(path, model, student, flag=, role=)` replaces `check_teacher_vocab` for a model whose samples the
    policy scores instead (S2L-PO's explorer: `sampling/s2l_po.py`)."""
    from accelerate.utils import is_peft_model
    from trl.models import prepare_deepspeed, prepare_fsdp
    from trl.trainer.utils import add_fused_lm_head, create_model_from_path, disable_dropout_in_model

    args = trainer.args
    student = trainer.accelerator.unwrap_model(trainer.model)
    student = student.get_base_model() if is_peft_model(student) else student
    check_teacher_tokenizer(path, trainer.processing_class, trust_remote_code=args.trust_remote_code, flag=flag,
                            role=role)
    try:
        teacher = create_model_from_path(
            path, dtype=student.dtype, attn_implementation=student.config._attn_implementation,
            trust_remote_code=args.trust_remote_code, device_map=None,
        )
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{flag}={path!r} could not be loaded as a causal LM ({err}); pass a model id or a local "
            f"folder holding the {role}'s config and weights."
        ) from err
    (vocab_check or check_teacher_vocab)(path, teacher, student, flag=flag, role=role)
    if args.disable_dropout:
        disable_dropout_in_model(teacher)
    teacher.requires_grad_(False)
    teacher.eval()
    add_fused_lm_head(teacher, temperature=trainer.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(teacher, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        return prepare_fsdp(teacher, trainer.accelerator)
    return trainer.accelerator.prepare_model(teacher, evaluation_mode=True)


def check_teacher_tokenizer(path: str, processing_class: Any, trust_remote_code: bool = False,
                            flag: str = "opd_teacher_model", role: str = "teacher") -> None:
    """The teacher's tokenizer must map every token to the same id as the student's: the teacher scores the
    student's token ids. `flag` and `role` name the config field and the model in the errors."""
    from transformers import AutoTokenizer

    student_tok = getattr(processing_class, "tokenizer", processing_class)
    try:
        teacher_tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{flag}={path!r}: no tokenizer could be loaded from it ({err}); the {role} scores the "
            "student's token ids, so it must ship the student's tokenizer. Save the student's tokenizer with it."
        ) from err
    if teacher_tok.get_vocab() != student_tok.get_vocab():
        ids_s, ids_t = student_tok.get_vocab(), teacher_tok.get_vocab()
        differing = sorted(k for k in ids_s.keys() | ids_t.keys() if ids_s.get(k) != ids_t.get(k))
        raise ValueError(
            f"{flag}={path!r} has a different tokenizer than the student ({len(ids_t)} vs {len(ids_s)} "
            f"tokens; e.g. {differing[:5]} map to other ids): the {role} scores the student's token ids, so pick a "
            f"{role} of the same model family (same tokenizer)."
        )


def check_teacher_vocab(path: str, teacher: torch.nn.Module, student: torch.nn.Module,
                        flag: str = "opd_teacher_model", role: str = "teacher") -> None:
    """The teacher's logits must cover every id the student can sample (`vocab_size` of the teacher ≥ the
    student's; larger, e.g. padded embedding tables of the same tokenizer, is fine: only sampled ids are read)."""
    v_teacher = teacher.config.get_text_config().vocab_size
    v_student = student.config.get_text_config().vocab_size
    if v_teacher < v_student:
        raise ValueError(
            f"{flag}={path!r} has vocab_size {v_teacher} but the student has {v_student}: the student can "
            f"sample token ids the {role} cannot score. Use a {role} of the same model family with at least the "
            "student's vocab_size."
        )


def teacher_token_logps(trainer: Any, teacher: torch.nn.Module, output: dict[str, Any],
                        forward_keys: tuple[str, ...] = ()) -> torch.Tensor:
    """`(B, T)` no-grad log-probs of this process's sampled completion tokens under the teacher (prompt + completion
    as the student saw them, logits divided by the run's temperature), through TRL's own
    `_get_per_token_logps_and_entropies` (not trl_groupx's memory paths, which patch the training model)."""
    import trl

    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trl.GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, teacher, input_ids, attention_mask, output["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size, compute_entropy=False,
            **{k: output[k] for k in forward_keys if k in output},
        )
    return logps.float()
