"""Trainer glue of logit-averaged reference anchoring (`rollout_filter="logit_avg"`; the formula and the choices are
in `trl_groupx/sampling/logit_avg.py`).

- Reference (`prepare_reference`, at construction): LoRA → the base model with the adapter disabled (nothing to
  build); full fine-tuning → a frozen copy of the policy as it is when the trainer is built, prepared like TRL's
  `ref_model`, kept as `trainer._logit_avg_reference`.
- Training (`mixed_logps_and_entropies`): replaces the trainer's `_get_per_token_logps_and_entropies`: per
  micro-batch the policy's logits (with grad) and the reference's (no grad) on the same rows, mixed, then
  `log_softmax(z_mix / T)`; padded targets are 0 in both outputs, as in TRL.
- Generation (`generate_with_logit_averaging`): wraps TRL's `_generate_single_turn`; every transformers `generate`
  call it makes gets a `ReferenceLogitMixer` appended to its logits processors.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers import LogitsProcessor, LogitsProcessorList
from trl.trainer.utils import use_adapter

from .._frozen_copy import frozen_policy_copy
from .logit_avg import ALPHA, VARIANT_ID, mixed_logits, mixed_token_logps

ReferenceForward = Callable[..., Any]


def prepare_reference(trainer: Any) -> None:
    """Construction: refuse what generates outside TRL's single-turn generator; build the full-fine-tuning
    reference (a frozen copy of the policy's current weights)."""
    for name in ("rollout_func", "tools", "environments"):
        if getattr(trainer, name, None):
            raise ValueError(f"rollout_filter={VARIANT_ID!r} samples from the mixed policy inside TRL's own single-turn "
                             f"generation, but this trainer has {name}; drop them or the variant.")
    trainer._logit_avg_reference = None
    if is_peft_model(trainer.accelerator.unwrap_model(trainer.model)):
        return
    # the class's own forward, without TRL's fused head: only plain logits are read from the reference
    reference = frozen_policy_copy(trainer.accelerator.unwrap_model(trainer.model))
    reference.eval()
    if trainer.is_deepspeed_enabled:
        from trl.models import prepare_deepspeed

        reference = prepare_deepspeed(reference, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        from trl.models import prepare_fsdp

        reference = prepare_fsdp(reference, trainer.accelerator)
    else:
        reference = trainer.accelerator.prepare_model(reference, evaluation_mode=True)
    trainer._logit_avg_reference = reference


@contextlib.contextmanager
def _as_reference(trainer: Any, model: Any) -> Iterator[Any]:
    """Yields the module whose forward is the reference's: the adapter-disabled PEFT model, or the frozen copy."""
    reference = getattr(trainer, "_logit_avg_reference", None)
    if reference is not None:
        yield reference
        return
    peft_model = trainer.accelerator.unwrap_model(model)
    with use_adapter(peft_model, adapter_name="ref" if "ref" in peft_model.peft_config else None):
        yield peft_model


def reference_logits(trainer: Any, model: Any, **inputs: Any) -> torch.Tensor:
    """No-grad logits of the reference on `inputs` (keyword arguments of a causal LM forward)."""
    with torch.no_grad(), _as_reference(trainer, model) as reference:
        return reference(**inputs).logits


def mixed_logps_and_entropies(
    trainer: Any, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
    batch_size: int | None = None, compute_entropy: bool = False, compute_aux_loss: bool = False, **multimodal: Any,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """Drop-in for TRL's `_get_per_token_logps_and_entropies` (same arguments, outputs and `batch_size`
    micro-batching) with the log-probs and entropies of the mixed policy at TRL's `temperature`."""
    if any(v is not None for v in multimodal.values()):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} supports text-only inputs; multimodal inputs were passed.")
    if compute_aux_loss:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} does not compute the MoE router aux loss; set "
                         "router_aux_loss_coef=0 or drop the variant.")
    alpha = getattr(trainer.args, ALPHA)
    batch_size = batch_size or input_ids.size(0)
    keep = min(logits_to_keep, input_ids.size(1) - 1)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
        forward = {"input_ids": ids, "attention_mask": mask, "logits_to_keep": keep + 1}
        with trainer.accelerator.autocast():
            policy = model(**forward).logits[:, :-1]
            reference = reference_logits(trainer, model, **forward)[:, :-1]
        targets = ids[:, -keep:]
        logps, entropies = mixed_token_logps(policy, reference, targets, alpha=alpha, temperature=trainer.temperature,
                                             compute_entropy=compute_entropy)
        padded = mask[:, -keep:] == 0  # TRL: padded targets are -100 -> 0 in both outputs
        all_logps.append(logps.masked_fill(padded, 0.0))
        if compute_entropy:
            all_entropies.append(entropies.masked_fill(padded, 0.0))
    logps = torch.cat(all_logps)
    entropies = torch.cat(all_entropies) if compute_entropy else None
    return logps, entropies, None


class ReferenceLogitMixer(LogitsProcessor):
    """One `generate` call's mixing: each step's scores `z_θ` become `α z_θ + (1 − α) z_ref`, with `z_ref` from the
    reference run on the tokens fed so far with its own KV cache, at generate's positions (cumulative attention mask
    − 1, as transformers' `_prepare_position_ids_for_generation`)."""

    def __init__(self, reference_step: ReferenceForward, attention_mask: torch.Tensor | None, alpha: float) -> None:
        self.reference_step, self.alpha = reference_step, float(alpha)
        self.mask = attention_mask
        self.cache: Any = None
        self.fed = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        length = input_ids.size(1)
        if self.mask is None:
            self.mask = torch.ones_like(input_ids)
        if self.mask.size(1) < length:  # generate appends a 1 per new token, finished rows included
            grow = self.mask.new_ones(self.mask.size(0), length - self.mask.size(1))
            self.mask = torch.cat([self.mask, grow], dim=1)
        mask = self.mask[:, :length]
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        out = self.reference_step(input_ids=input_ids[:, self.fed :], attention_mask=mask,
                                  position_ids=positions[:, self.fed :], cache=self.cache, logits_to_keep=1)
        # a model that returns no cache (e.g. gradient checkpointing in training mode) is re-run from the start
        cache = getattr(out, "cache", None)
        self.cache = cache if cache is not None else getattr(out, "past_key_values", None)
        self.fed = length if self.cache is not None else 0
        return mixed_logits(scores, out.logits[:, -1], self.alpha).to(scores.dtype)


@contextlib.contextmanager
def _mixing_generate(model: Any, make_processor: Callable[[torch.Tensor | None], ReferenceLogitMixer]) -> Iterator[None]:
    """Shadow `model.generate` (instance attribute) with one that appends a fresh mixer to each call."""
    shadowed = "generate" in vars(model)
    original = model.generate

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Any:
        processor = make_processor(kwargs.get("attention_mask"))
        kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), processor])
        return original(*args, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        if shadowed:
            model.generate = original
        else:
            del model.generate


def _cache_keyword(reference: Any) -> str:
    """The KV-cache argument of the reference's forward: `cache` (recent transformers 5) or `past_key_values`."""
    base = reference.get_base_model() if hasattr(reference, "get_base_model") else reference
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def reference_step_fn(trainer: Any, model: Any) -> ReferenceForward:
    """The reference's cached decoding forward: `(cache=..., **inputs) -> model output` under no grad."""

    def step(cache: Any = None, **inputs: Any) -> Any:
        with torch.no_grad(), _as_reference(trainer, model) as reference:
            return reference(**inputs, **{_cache_keyword(reference): cache}, use_cache=True)

    return step


def generate_with_logit_averaging(trainer: Any, generate: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`generate(*args, **kwargs)` (TRL's `_generate_single_turn`) sampling from the mixed policy."""
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)  # what TRL's unwrap_model_for_generation yields
    step = reference_step_fn(trainer, model)
    alpha = getattr(trainer.args, ALPHA)
    with _mixing_generate(model, lambda mask: ReferenceLogitMixer(step, mask, alpha)):
        return generate(*args, **kwargs)
