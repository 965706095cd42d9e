"""Shared-prefix forward (`prefix_grouper`): each distinct prompt of a micro-batch is encoded once, not G times.

Prefix Grouper (catalog id `prefix_grouper`; knob called `shared_prefix_forward` in the catalog) restructures
self-attention so that the prompt shared by the G completions of a group goes through the model once, with forward
outputs and gradients identical to the standard forward. The official code
(johncaged/PrefixGrouper@1accedc043c9ea79165888f48ab163fb8d6d5bb0:src/prefix_grouper/forward.py:
AttentionForward.__call__, lines 49-80, with `concat_input`/`split_output` in `src/prefix_grouper/__init__.py`)
works inside each attention call on a packed `[prefix, suffix_1, ..., suffix_G]` sequence: prefix queries attend to
the prefix keys, and each suffix's queries attend to the prefix keys/values repeated per suffix
(`batch_repeat_cat`) concatenated with its own. Officially only FlashAttention-2 is supported; its sdpa/eager
registration fails under transformers 5.24 (/work/shared/official-code.md). This module computes the same attention
with transformers' own key/value cache instead, so it needs no attention adapter and runs on the implementations
that honour a 2-D padding mask with a cache (eager and sdpa tested here):

1. rows of the micro-batch whose prompt part (the first `T − logits_to_keep` columns: token ids where
   `attention_mask == 1`, and the mask itself) is identical form a group; this is detected on the tensors, so groups
   broken by TRL's shuffling/micro-batch split still work, and a prompt seen once is a group of one;
2. the decoder body runs once on the U distinct prompts, left padding and all, with `use_cache=True`; its key/value
   cache (which stays in the autograd graph) is expanded to the B rows with `Cache.batch_select_indices` (an index
   gather, so the gradients of the G copies add up in the single prompt forward);
3. the decoder runs the completion columns of all B rows with that cache and the full `(B, T)` attention mask. The
   position ids are the defaults of the standard forward (the column index, padding included, since TRL passes
   none), so every token sees the same positions, keys and mask as in TRL's single forward;
4. the hidden state of the last prompt column (it predicts the first completion token) comes from the prompt pass,
   the others from the completion pass, and TRL 1.16's own fused LM-head kernel (`trl.kernels.ChunkedLogProbFunction`,
   with the model's logit scale / soft-cap read as `trl.trainer.utils.add_fused_lm_head` reads them, temperature,
   `cast_lm_head_to_fp32`) scores the non-padded completion tokens. With `logps_chunk_size` also set, the head is
   the chunked one of `chunked_logps.py` instead, so the two flags combine. Padded positions are 0 in both outputs.

Exercised by the tests (`tests/unit/memory/test_prefix_grouper.py`, `tests/integration/test_prefix_grouper.py`), on
the shipped tiny Llama: eager and sdpa, full fine-tuning, LoRA and QLoRA (NF4 on CPU), left-padded prompts of
different lengths, right-padded completions, several groups per micro-batch and groups split across micro-batches,
temperature ≠ 1, entropies, a no-grad call, a single completion token, `logps_chunk_size` together with this flag,
the reference log-probs (`beta > 0`; adapter-disabled base with LoRA, a second model with full fine-tuning), and a
full GRPO step with gradient accumulation. Exactness: in float64 (sdpa, Llama's RMSNorm kept in float64) hidden
states and all parameter gradients equal the standard forward to 1e-10 (observed 1e-15 / 1e-14). In float32 the
two paths round differently (same sums in another order), so log-probs, entropies and gradients are compared with
max|Δ| ≤ 1e-5·max(1, max|x|); observed: log-probs/entropies ≤ 3e-6 absolute (|log p| up to ~10), gradients
≤ 2.5e-6 of each tensor's scale (TRL against itself with another micro-batch size: 5e-7). QLoRA adapter gradients
(bf16, as TRL casts them) agree to 1e-2 relative. Not exercised: DDP (the request is routed through one
`model(...)` call per micro-batch, like `chunked_logps.py`, so DDP sees one forward per backward), FSDP/DeepSpeed,
flash-attention (not installed here; refused, with every implementation other than eager/sdpa, until tested), GPUs,
and models other than Llama. With dropout active (e.g. `lora_dropout > 0`), the G rows of a group share the prompt's
dropout mask, unlike G independent forwards: same expectation, not the same random numbers.

Refused with a `ValueError` naming the flag: `gradient_checkpointing=True` at config time (transformers'
`GradientCheckpointingLayer` drops the cache inside checkpointed layers, so completions could not attend to the
prompt); at the first log-prob call (the trainer's `__init__` is not touched): multimodal inputs or configs, models
without a separate decoder body, models whose decoder takes no cache or whose cache is not plain full-attention
`DynamicLayer`s (sliding-window, hybrid, recurrent/stateful models), attention implementations other than eager and
sdpa, gradient checkpointing switched on directly on the model, and the MoE router aux loss.

Where it saves. The prompt's MLP/projection work and activations are paid once per group instead of G times; the
attention of completion tokens to the prompt and the (expanded) prompt keys/values are still per row. Within a
micro-batch only: TRL shuffles the generation batch and cuts it into micro-batches of `per_device_train_batch_size`,
so the saving is largest when a micro-batch holds whole groups (e.g. `steps_per_generation=1`). The log-probs of
the old policy and the reference are computed on the unshuffled generation batch (chunks of
`per_device_train_batch_size`), where groups are contiguous. Measured on CPU (`benchmarks/results/prefix_grouper.md`:
random Llama, hidden 256, 4 layers, one group of G = 8, 512-token prompt, 32-token completions, sdpa, float32): one
loss step (forward + backward) takes 0.20× the time and 0.17× the peak memory of plain TRL 1.16. Not measured on a
GPU.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

FLAG = "prefix_grouper"
_KWARG = "groupx_prefix_grouper"  # the keyword routed through the model wrappers to the patched forward
SUPPORTED_ATTENTION = ("eager", "sdpa")


@dataclass
class PrefixGrouperArgs:
    """
    prefix_grouper (`bool`, *optional*, defaults to `False`):
        Shared-prefix forward (Prefix Grouper): rows of a micro-batch with the same prompt encode it once, and their
        completions attend to its key/value cache; log-probs, entropies and gradients equal the standard forward.
        Needs `gradient_checkpointing=False`; text-only causal LMs with full attention, eager or sdpa attention.
        Combines with `logps_chunk_size`. See `trl_groupx/memory/prefix_grouper.py`.
    """

    prefix_grouper: bool = field(
        default=False,
        metadata={
            "help": "Shared-prefix forward: encode each distinct prompt of a micro-batch once and run its completions "
            "on the prompt's KV cache (same log-probs and gradients). Needs gradient_checkpointing=False."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if not isinstance(self.prefix_grouper, bool):
            raise ValueError(f"{FLAG}={self.prefix_grouper!r} must be True or False.")  # noqa: TRY004
        checkpointing = getattr(self, "gradient_checkpointing", False) or getattr(
            self, "activation_checkpointing", False
        )
        if self.prefix_grouper and checkpointing:
            raise ValueError(
                f"{FLAG}=True needs gradient_checkpointing=False: transformers drops the key/value cache inside "
                "checkpointed layers, so the completions could not attend to the shared prompt. Set "
                f"gradient_checkpointing=False (TRL's default is True) or unset {FLAG}."
            )


@dataclass(frozen=True)
class _Request:
    logits_to_keep: int
    temperature: float
    compute_entropy: bool
    cast_lm_head_to_fp32: bool
    chunk_size: int | None  # logps_chunk_size, or None for TRL's fused head


def _cache_kwarg(decoder) -> str | None:
    params = inspect.signature(decoder.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def check_supported(model, multimodal: dict[str, Any] | None = None, compute_aux_loss: bool = False) -> None:
    """Raise a `ValueError` naming `prefix_grouper` for what the shared-prefix forward does not handle."""
    from .chunked_logps import check_text_lm_with_head

    check_text_lm_with_head(model, FLAG, multimodal, compute_aux_loss)
    config, decoder = model.config, model.get_decoder()
    if getattr(model, "_is_stateful", False) or _cache_kwarg(decoder) is None:
        raise ValueError(f"{FLAG} needs a decoder that takes a key/value cache; {type(model).__name__} does not.")
    from transformers.cache_utils import DynamicCache, DynamicLayer

    try:
        layers = DynamicCache(config=config).layers
    except Exception as err:  # any failure means we cannot build the cache we rely on
        raise ValueError(f"{FLAG}: cannot build a DynamicCache for {type(model).__name__} ({err}).") from err
    if any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise ValueError(
            f"{FLAG} supports full-attention key/value caches only; {type(model).__name__} uses {kinds} "
            f"(sliding-window, hybrid or recurrent layers). Unset {FLAG}."
        )
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"{FLAG} is tested with attn_implementation in {SUPPORTED_ATTENTION}; the model uses {impl!r}. "
            f"Load it with attn_implementation='sdpa' or 'eager', or unset {FLAG}."
        )
    on = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    if getattr(model, on, False):
        raise ValueError(
            f"{FLAG} needs gradient checkpointing off (transformers drops the cache inside checkpointed layers); "
            f"it is on for this model. Disable it or unset {FLAG}."
        )


def group_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(representative, inverse)`: row `representative[u]` holds the u-th distinct prompt, `inverse[b]` the
    index of row b's prompt. Prompts are equal when their masks are equal and their tokens agree where unmasked."""
    key = torch.cat([prompt_ids.long().masked_fill(prompt_mask == 0, -1), prompt_mask.long()], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(key.size(0), device=key.device)
    n_unique = int(inverse.max()) + 1
    representative = torch.full((n_unique,), key.size(0), device=key.device, dtype=torch.long)
    representative = representative.scatter_reduce(0, inverse, rows, reduce="amin")
    return representative, inverse


def install(model) -> None:
    """Patch `model.forward` (a `PreTrainedModel`, inside any PEFT/DDP wrapper) to honour the keyword. Idempotent;
    without the keyword the previous forward (TRL's fused one) runs unchanged."""
    if getattr(model, "_groupx_prefix_grouper_installed", False):
        return
    check_supported(model)
    previous = model.forward

    @functools.wraps(previous)
    def forward(*args, **kwargs):
        request: _Request | None = kwargs.pop(_KWARG, None)
        if request is None:
            return previous(*args, **kwargs)
        return _grouped_forward(model, request, **kwargs)

    model.forward = forward
    model._groupx_prefix_grouper_installed = True


def _head(model, request: _Request, states: torch.Tensor, targets: torch.Tensor):
    from .chunked_logps import chunked_token_logps, logit_transform

    lm_head = model.get_output_embeddings()
    logit_scale, softcap = logit_transform(model.config)
    if request.chunk_size is not None:  # combined with logps_chunk_size: its checkpointed chunked head
        return chunked_token_logps(
            states, targets, lm_head, chunk_size=request.chunk_size, temperature=request.temperature,
            compute_entropy=request.compute_entropy, logit_scale=logit_scale, softcap=softcap,
            upcast=request.cast_lm_head_to_fp32,
        )
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    outputs = ("log_probs", "entropy") if request.compute_entropy else ("log_probs",)
    weight, bias = lm_head.weight, lm_head.bias
    if request.cast_lm_head_to_fp32:
        with torch.autocast(states.device.type, enabled=False):
            out = ChunkedLogProbFunction.apply(
                states.float(), weight, bias, targets, request.temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, softcap,
                logit_scale, outputs,
            )
    else:
        out = ChunkedLogProbFunction.apply(
            states, weight, bias, targets, request.temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, softcap, logit_scale,
            outputs,
        )
    return out[0], out[1]


def grouped_hidden_states(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int) -> torch.Tensor:
    """Final hidden states `(B, keep, H)` of the positions that predict the last `keep` tokens (columns
    `T − keep − 1 … T − 2`), computed with each distinct prompt (the first `T − keep` columns) encoded once.
    Equal to `decoder(input_ids, attention_mask).last_hidden_state[:, -keep - 1 : -1]`."""
    cache_kw = _cache_kwarg(decoder)
    split = input_ids.size(1) - keep  # prompt columns (≥ 1)
    representative, inverse = group_rows(input_ids[:, :split], attention_mask[:, :split])
    prefix = decoder(
        input_ids=input_ids[representative, :split], attention_mask=attention_mask[representative, :split],
        use_cache=True,
    )
    cache = getattr(prefix, "cache", None)
    cache = getattr(prefix, "past_key_values", None) if cache is None else cache
    cache.batch_select_indices(inverse)  # U → B rows; an index gather, so gradients flow back to the U rows
    suffix = decoder(
        input_ids=input_ids[:, split:], attention_mask=attention_mask, use_cache=True, **{cache_kw: cache}
    )
    return torch.cat([prefix.last_hidden_state[inverse, split - 1 :], suffix.last_hidden_state[:, :-1]], dim=1)


def _grouped_forward(model, request: _Request, input_ids, attention_mask, **kwargs):
    # PEFT's forward adds `labels=None`, `inputs_embeds=None`, ...: nothing else may reach the decoder
    extra = {k for k, v in kwargs.items() if v is not None and k not in ("labels", "return_dict", "use_cache")}
    if extra:
        raise ValueError(f"{FLAG} supports input_ids and attention_mask only; got {sorted(extra)}. Unset {FLAG}.")
    keep = min(request.logits_to_keep, input_ids.size(1) - 1)  # TRL returns at most T − 1 positions
    split = input_ids.size(1) - keep
    hidden = grouped_hidden_states(model.get_decoder(), input_ids, attention_mask, keep)

    lm_head = model.get_output_embeddings()
    device = lm_head.weight.device
    hidden = hidden.to(device)
    targets = input_ids[:, split:].to(device)
    mask = attention_mask[:, split:].to(device) != 0  # TRL: padded targets are −100 → 0 in both outputs
    logps, entropies = _head(model, request, hidden[mask], targets[mask])
    scatter = lambda x: x.new_zeros(mask.shape).masked_scatter(mask, x)
    return scatter(logps), (scatter(entropies) if entropies is not None else None)


def prefix_grouped_logps_and_entropies(
    trainer, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
    compute_aux_loss=False, **multimodal,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """Drop-in for TRL 1.16's `GRPOTrainer._get_per_token_logps_and_entropies` (same arguments, outputs and
    `batch_size` micro-batching) computed with the shared-prefix forward."""
    from accelerate.utils import is_peft_model

    inner = trainer.accelerator.unwrap_model(model)
    inner = inner.get_base_model() if is_peft_model(inner) else inner
    check_supported(inner, multimodal, compute_aux_loss)
    install(inner)
    request = _Request(
        logits_to_keep=logits_to_keep, temperature=trainer.temperature, compute_entropy=compute_entropy,
        cast_lm_head_to_fp32=bool(getattr(trainer.args, "cast_lm_head_to_fp32", False)),
        chunk_size=getattr(trainer.args, "logps_chunk_size", None),
    )
    from .chunked_logps import micro_batched_forward

    return micro_batched_forward(trainer, model, input_ids, attention_mask, batch_size, {_KWARG: request},
                                 compute_entropy)
