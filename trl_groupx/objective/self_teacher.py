"""The `self_teacher_topk` requirement (SRPO, `objective/srpo.py`): per generation batch, which rollouts are routed
to self-distillation, and the self-teacher's top-k next-token distribution on their completions; per micro-batch,
the student's log-probs of the same top-k tokens, with grad.

Once per generation batch (`self_teacher_targets`, no grad):

1. Routing: a rollout is correct when its total reward (weighted sum of the reward functions, gathered over all
   processes) is at least `srpo_success_threshold`; a failed rollout (finite reward below it) is routed when its
   group has a correct rollout.
2. Teacher prompts: TRL's `SuccessfulRolloutTeacherContextBuilder` (trl==1.16.0
   `trl/experimental/sdpo/sdpo_trainer.py`) re-writes each prompt with the group's first correct completion
   (`SDPOConfig`'s defaults: its templates, teacher prompts cut to their last 10240 tokens, `<think>` blocks of
   the demonstration kept, no environment feedback), gathering across processes itself; its
   tokenisation is `SDPOTrainer._tokenize_prompts_untruncated`, called on this trainer's tokenizer.
3. Teacher forward on the routed rows only, `(teacher prompt, completion)`, a micro-batch of rows at a time
   (`token_weights/_full_logits.completion_logit_rows`); each row's `(T, V)` logits, divided by the sampling
   temperature, are reduced at once to the full-vocabulary entropy and the top-k `(ids, log-probs)` — no `(N, T, V)`
   tensor is ever built.
4. Entropy weights `exp(−β H)` normalised over the routed loss tokens of all processes (`srpo.entropy_weights`).

Stored in the generation output as `groupx_srpo_routed (N,)`, `groupx_srpo_weights (N, T)`,
`groupx_srpo_topk_ids (N, T, k)` and `groupx_srpo_teacher_topk_logps (N, T, k)` (0 / uniform on rows that are not
routed), which TRL shuffles and splits with the rows.

Per micro-batch (`student_forward`): one forward of the policy that returns the sampled tokens' log-probs, their
entropies and the log-probs of the teacher's top-k ids, from the logits of the micro-batch's completion positions
(the model's `(B, T, V)` logits are kept for the backward, as in TRL's non-fused path; the float32 log-softmax is
built one row at a time under activation checkpointing; use a small `per_device_train_batch_size` for large
vocabularies).
A micro-batch with no routed row runs TRL's own log-prob path instead.

Self-teacher (`srpo_teacher_kind`): `"ema"` (default, SDPO's; rate `srpo_teacher_update_rate` = 0.05 after every
optimizer step): under pure LoRA a second adapter kept by TRL's `PEFTAdapterEMACallback` (zero-initialised, as TRL
does), else a frozen copy of the model updated with TRL's `SyncRefModelCallback.sync_target_model`; `"live"`: the
current policy under no grad; `"base"`: the initial policy (the model with its LoRA adapter disabled, or a frozen
copy). The copy is refused under DeepSpeed / FSDP (use LoRA or `"live"`).

Checkpoints: the `"ema"` teacher's weights live in `trainer.variant_state[STATE_KEY]` (the pattern of SPPO's value
model, `advantages/sppo_value.py`): `{"weights": ...}` points at the live tensors (the LoRA EMA callback's shadow
weights, or the copy's `state_dict()`), so every checkpoint saves the current teacher, and a resumed run loads the
saved weights back into the teacher at its first step, before the first generation batch (`SelfTeacher.sync`),
continuing the EMA where it stopped. Under full fine-tuning each checkpoint thus holds a second copy of the model's
weights (in `trl_groupx_variant_state.pt`). Choice: the `"base"` teacher is not saved (it is the initial model,
rebuilt from the same model on resume; saving it would double every checkpoint for nothing); `"live"` has no
state.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace
from typing import Any

import torch
from transformers import TrainerCallback

from .._frozen_copy import frozen_policy_copy

TEACHER_ADAPTER = "srpo_teacher"
STATE_KEY = "srpo/self_teacher"  # the EMA teacher's weights in `trainer.variant_state`, saved with checkpoints
KEYS = ("groupx_srpo_routed", "groupx_srpo_weights", "groupx_srpo_topk_ids", "groupx_srpo_teacher_topk_logps")


@dataclasses.dataclass
class SelfDistillBatch:
    """The self-distillation inputs of one micro-batch (`ObjectiveContext.self_distill`).

    Attributes:
        routed (`torch.Tensor`): `(B,)` bool, rows trained by self-distillation instead of the policy gradient.
        weights (`torch.Tensor`): `(B, T)` float32 entropy weights, 0 off the routed rows' loss tokens.
        teacher_topk_logps (`torch.Tensor`): `(B, T, k)` float32 teacher log-probs of its top-k tokens, no grad.
        student_topk_logps (`torch.Tensor`): `(B, T, k)` float32 current-policy log-probs of the same ids, with grad.
    """

    routed: torch.Tensor
    weights: torch.Tensor
    teacher_topk_logps: torch.Tensor
    student_topk_logps: torch.Tensor


class _TeacherEMACallback(TrainerCallback):
    """EMA of a full-model teacher after every optimizer step (TRL's `sync_target_model`)."""

    def __init__(self, teacher: torch.nn.Module, rate: float):
        self.teacher, self.rate = teacher, rate

    def on_step_end(self, args, state, control, model=None, **kwargs):
        from trl.trainer.callbacks import SyncRefModelCallback

        SyncRefModelCallback.sync_target_model(model, self.teacher, self.rate)


class _RestoreTeacherCallback(TrainerCallback):
    """Load a resumed checkpoint's teacher at the first step (`SelfTeacher.sync`), before anything else runs on the
    GPU, so that the loaded copy of the weights is released before the first generation batch."""

    def __init__(self, teacher: SelfTeacher):
        self.teacher = teacher

    def on_step_begin(self, args, state, control, **kwargs):
        self.teacher.sync()


class SelfTeacher:
    """The self-teacher of a run: which weights score the re-prompted rollouts, and the EMA that updates them."""

    def __init__(self, trainer: Any):
        from accelerate.utils import is_peft_model
        from trl.experimental.sdpo.teacher_sync import PEFTAdapterEMACallback, is_pure_lora_training

        args = trainer.args
        self.kind = args.srpo_teacher_kind
        self.copy: torch.nn.Module | None = None
        self.adapter: str | None = None  # PEFT: adapter to activate for the teacher; None = adapters disabled
        self.ema_adapter: Any = None  # LoRA "ema": TRL's PEFTAdapterEMACallback, whose shadow weights are the teacher
        self.state: dict[str, Any] | None = None  # `variant_state[STATE_KEY]` once `keep_state` registered it
        self._published: Any = None
        self._unwrap = trainer.accelerator.unwrap_model
        self.peft = is_peft_model(trainer.accelerator.unwrap_model(trainer.model))
        if self.kind == "live":
            return
        if self.kind == "ema":
            trainer.add_callback(_RestoreTeacherCallback(self))
        if self.peft and (self.kind == "base" or is_pure_lora_training(trainer.model, trainer.accelerator)):
            if self.kind == "ema":
                callback = PEFTAdapterEMACallback(trainer.model, teacher_adapter_name=TEACHER_ADAPTER,
                                                  update_rate=args.srpo_teacher_update_rate, sync_steps=1,
                                                  accelerator=trainer.accelerator)
                callback._initialize_teacher_adapter()  # now, so that the first generation batch has a teacher
                trainer.add_callback(callback)
                self.adapter = TEACHER_ADAPTER
                self.ema_adapter = callback
            return
        if self.peft:
            raise ValueError(
                "srpo_teacher_kind='ema' with a PEFT model that trains more than LoRA weights cannot keep an EMA "
                "adapter; train pure LoRA, or set srpo_teacher_kind='live' or 'base'."
            )
        if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
            raise ValueError(
                f"srpo_teacher_kind={self.kind!r} keeps a full copy of the model, which is not supported under "
                "DeepSpeed or FSDP; train with LoRA (peft_config) or set srpo_teacher_kind='live'."
            )
        copy = frozen_policy_copy(trainer.accelerator.unwrap_model(trainer.model))
        copy.eval()
        self.copy = copy
        if self.kind == "ema":
            trainer.add_callback(_TeacherEMACallback(copy, args.srpo_teacher_update_rate))

    # ---- checkpointed state ------------------------------------------------------------------------------------

    def keep_state(self, variant_state: dict[str, dict[str, Any]]) -> None:
        """Register the `"ema"` teacher's weights in the trainer's `variant_state`, so that checkpoints save them."""
        if self.kind != "ema":
            return
        self.state = variant_state.setdefault(STATE_KEY, {})
        self.publish()

    def publish(self) -> None:
        """Point the state at the live teacher tensors: the copy's `state_dict()` (updated in place by the EMA), or
        the LoRA callback's shadow dict (each update replaces its tensors' `.data`, the same objects)."""
        if self.state is None:
            return
        weights = self.copy.state_dict() if self.copy is not None else self.ema_adapter.shadow_weights
        self.state["weights"] = weights
        self._published = weights

    def sync(self) -> None:
        """Load the saved teacher into the copy or the LoRA teacher adapter when a resumed checkpoint replaced the
        state (a no-op otherwise); a checkpoint without it leaves the teacher as it is, and the state points at it
        again, so that the next checkpoint saves it."""
        if self.state is None or self.state.get("weights") is self._published:
            return
        saved = self.state.get("weights")
        if saved is not None and self.copy is not None:
            self.copy.load_state_dict(saved)
        elif saved is not None:
            self._load_adapter(saved)
        self.publish()

    def _load_adapter(self, saved: dict[str, torch.Tensor]) -> None:
        """Saved shadow weights into TRL's EMA callback and the teacher adapter (the callback's own loading steps)."""
        from peft import set_peft_model_state_dict

        shadow = self.ema_adapter.shadow_weights
        if saved.keys() != shadow.keys():
            raise ValueError(
                f"the checkpoint's SRPO teacher adapter has other weights ({sorted(set(saved) ^ set(shadow))[:4]} ...)"
                " than this run's LoRA adapter; resume with the same peft_config."
            )
        with torch.no_grad():
            for key, value in saved.items():
                shadow[key].copy_(value)
        model = self._unwrap(self.ema_adapter.model)
        active = model.active_adapter  # activate the teacher adapter, load it, switch back, as TRL's callback does
        model.set_adapter(TEACHER_ADAPTER)
        set_peft_model_state_dict(model, shadow, adapter_name=TEACHER_ADAPTER)
        model.set_adapter(active)

    def model_and_context(self, trainer: Any) -> tuple[torch.nn.Module, contextlib.AbstractContextManager]:
        """The module to run for the teacher and the context that routes it to the teacher's weights."""
        if self.copy is not None:
            return self.copy, contextlib.nullcontext()
        if self.kind == "live" or not self.peft:
            return trainer.model, contextlib.nullcontext()
        from trl.trainer.utils import use_adapter

        return trainer.model, use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=self.adapter)


def global_rewards(trainer: Any) -> torch.Tensor:
    """`(N,)` weighted total reward of every rollout of the generation batch (NaN where no function scored it)."""
    per_func = trainer._rewards_per_func
    rewards = (per_func * trainer.reward_weights.to(per_func.device)).nansum(dim=1)
    rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
    return rewards


def route(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """`(N,)` bool: failed rollouts (finite reward below `threshold`) whose group has a correct one (≥ `threshold`);
    NaN rewards are neither."""
    correct = rewards >= threshold  # False for NaN
    failed = torch.isfinite(rewards) & ~correct
    group_has_correct = correct.view(-1, group_size).any(dim=1).repeat_interleave(group_size)
    return failed & group_has_correct


class _BuilderHost:
    """The attributes of an `SDPOTrainer` that TRL's `SuccessfulRolloutTeacherContextBuilder` reads, taken from our
    trainer, with `SDPOConfig`'s defaults for its own settings."""

    def __init__(self, trainer: Any, threshold: float):
        from trl.experimental.sdpo import SDPOConfig, SDPOTrainer

        defaults = {f.name: f.default for f in dataclasses.fields(SDPOConfig)
                    if f.default is not dataclasses.MISSING}
        self.args = SimpleNamespace(**{**defaults, "success_reward_threshold": threshold,
                                       "include_environment_feedback": False})
        self._tokenize = SDPOTrainer._tokenize_prompts_untruncated
        for name in ("accelerator", "model", "num_generations", "num_generations_eval", "processing_class",
                     "_tokenizer", "chat_template_kwargs"):
            setattr(self, name, getattr(trainer, name))

    def _tokenize_prompts_untruncated(self, prompts: list[Any]) -> list[list[int]]:
        return self._tokenize(self, prompts)


def self_teacher_targets(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """The SRPO routing and teacher targets of this process's rows (see the module docstring); keys `KEYS`."""
    from trl.experimental.sdpo.sdpo_trainer import SuccessfulRolloutTeacherContextBuilder

    from .srpo import entropy_weights, teacher_confidence

    args, acc = trainer.args, trainer.accelerator
    trainer._self_teacher.sync()  # a resumed run: the checkpoint's EMA teacher, before its first use
    group_size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
    completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
    local_n, length = completion_ids.shape
    device = completion_ids.device
    start = acc.process_index * local_n
    rewards = global_rewards(trainer)
    routed = route(rewards, group_size, args.srpo_success_threshold)[start : start + local_n].to(device)

    host = _BuilderHost(trainer, args.srpo_success_threshold)
    # the builder treats a NaN reward as not successful, as `route` does; it gathers over processes itself
    teacher = SuccessfulRolloutTeacherContextBuilder(host).build(
        output, [x["prompt"] for x in inputs], rewards[start : start + local_n].to(device))

    k = min(args.srpo_distill_topk, acc.unwrap_model(trainer.model).config.get_text_config().vocab_size)
    topk_ids = torch.zeros(local_n, length, k, dtype=torch.long, device=device)
    # rows not routed: a uniform distribution over k ids, finite and never weighted
    topk_logps = torch.full((local_n, length, k), -float(torch.log(torch.tensor(float(k)))), device=device)
    entropies = torch.zeros(local_n, length, device=device)
    rows = routed.nonzero().squeeze(1)
    # every process runs as many teacher forwards as the one with the most routed rows (sharded models gather their
    # weights in each forward), repeating a row whose result is then dropped
    most = int(acc.gather(torch.tensor([rows.numel()], device=device)).max())
    if most > 0:
        run = torch.cat([rows, rows.new_zeros(most - rows.numel())])
        _teacher_topk(trainer, teacher["teacher_input_ids"][run], teacher["teacher_attention_mask"][run], length,
                      k, rows.tolist(), topk_ids, topk_logps, entropies)
    loss_mask = completion_mask if "tool_mask" not in output else completion_mask * output["tool_mask"]
    distill_mask = loss_mask * routed[:, None]
    raw = teacher_confidence(entropies, distill_mask, args.srpo_entropy_beta)  # normalised over all processes
    totals = acc.reduce(torch.stack([raw.sum(), distill_mask.sum().float()]), reduction="sum")
    weights = entropy_weights(entropies, distill_mask, args.srpo_entropy_beta, total=(totals[0], totals[1]))
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode]["groupx/srpo_routed_fraction"].append(
        acc.gather(routed.float()).mean().item())
    return dict(zip(KEYS, (routed, weights, topk_ids, topk_logps), strict=True))


def _teacher_topk(trainer, input_ids, attention_mask, length, k, rows, topk_ids, topk_logps, entropies) -> None:
    """Fill the routed rows' (`rows`, local indices; `input_ids` may hold more, repeated, rows after them) top-k ids,
    log-probs and entropies from the teacher, one row's logits at a time."""
    from ..token_weights._full_logits import completion_logit_rows

    model, context = trainer._self_teacher.model_and_context(trainer)
    with context:
        stream = completion_logit_rows(
            model, input_ids, attention_mask, length, feature="srpo's self-teacher",
            batch_size=trainer.args.per_device_train_batch_size, autocast=trainer.accelerator.autocast)
        for index, (_, keep, logits) in enumerate(stream):
            if index >= len(rows):  # a repeated row that only keeps the forward count equal across processes
                continue
            row = rows[index]
            logps = (logits / trainer.temperature).log_softmax(-1)
            entropies[row] = torch.where(keep, -(logps.exp() * logps).sum(-1), 0.0)
            values, ids = logps.topk(k, dim=-1)
            topk_ids[row], topk_logps[row] = ids, values


def student_forward(trainer: Any, model, inputs: dict[str, Any], input_ids, attention_mask, topk_ids,
                    compute_aux_loss: bool):
    """`(logps, entropies, aux_loss, student_topk_logps)` of one micro-batch: the sampled tokens' log-probs, their
    entropies (no grad) and the log-probs of `topk_ids (B, T, k)`, all at the sampling temperature, from one
    forward of the completion positions. The model's `(B, T, V)` logits are kept for the backward; the float32
    log-softmax is built one row at a time under activation checkpointing, so only one row's `(T, V)` copy exists."""
    from torch.utils.checkpoint import checkpoint

    completion_ids = inputs["completion_ids"]
    length = completion_ids.size(1)
    extra = {"output_router_logits": True} if compute_aux_loss else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length + 1, use_cache=False,
                **extra)
    logits = out.logits[:, -(length + 1) : -1]
    temperature = trainer.temperature

    def row_head(z: torch.Tensor, ids: torch.Tensor, topk: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logp_all = (z.float() / temperature).log_softmax(-1)
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1), logp_all.gather(-1, topk), entropy

    rows = []
    for row in range(logits.size(0)):
        args = (logits[row], completion_ids[row], topk_ids[row])
        rows.append(checkpoint(row_head, *args, use_reentrant=False) if logits.requires_grad else row_head(*args))
    logps, topk_logps, entropies = (torch.stack(parts) for parts in zip(*rows, strict=True))
    aux_loss = getattr(out, "aux_loss", None) if compute_aux_loss else None
    return logps, entropies, aux_loss, topk_logps
