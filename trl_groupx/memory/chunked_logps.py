"""Chunked per-token log-probs (`logps_chunk_size`): the LM head applied a few completion tokens at a time.

`GRPOTrainer._get_per_token_logps_and_entropies` calls `chunked_per_token_logps_and_entropies` when
`GRPOConfig.logps_chunk_size` is set (it calls TRL unchanged otherwise). Per micro-batch of `batch_size` sequences
(TRL's own micro-batching), it

1. runs the decoder body (`model.get_decoder()`, reached through the accelerate/DDP and PEFT wrappers by routing a
   keyword through `model(...)`, so DDP's gradient hooks and LoRA layers work as usual) to get the final hidden
   states — the LM head is never called on the whole sequence;
2. keeps the `logits_to_keep` positions that predict completion tokens and, of those, only the ones whose target
   token is not padding (`attention_mask == 1`);
3. projects them through the model's own `lm_head` module `logps_chunk_size` rows at a time, each chunk inside
   `torch.utils.checkpoint` (non-reentrant): the forward keeps no chunk's logits, and the backward recomputes one
   chunk at a time, so at most one `logps_chunk_size × V` block of logits (plus its softmax temporaries) is alive.

Numbers are TRL 1.16's fused LM head's (`trl.trainer.utils.add_fused_lm_head`): logits are multiplied by the
model's logit scale (`logit_scale` / `output_multiplier` / `lm_head_multiplier` / `1/logits_scaling`, read from the
text config exactly as TRL reads them), soft-capped with `final_logit_softcapping` when the config has it, divided by
`args.temperature`, and log-softmaxed in float32; padded positions are 0 in both outputs. Entropies are computed
(and differentiable) only when TRL asks for them. `cast_lm_head_to_fp32=True` runs the head in float32 outside
autocast, like TRL. Log-probs, entropies and gradients match TRL's path to float32 rounding (tests:
`tests/unit/memory/test_chunked_logps.py`, `tests/integration/test_chunked_logps.py`).

Supported (tested): decoder-only causal LMs with a separate output-embedding module (tied or untied), full
fine-tuning, LoRA on the body, QLoRA (bitsandbytes NF4), gradient checkpointing, DDP (2 processes, gloo), the
adapter-disabled base as reference, and logit soft-capping (Gemma 2) and logit scaling (Granite, Cohere), which are
handled, not refused. The head is called as a module, so a LoRA adapter on `lm_head` would be applied too
(untested). Refused with a `ValueError` naming the flag, at the first log-prob call, i.e. the first generation
batch (the trainer's `__init__` is not touched by this feature): multimodal inputs and vision-language configs,
models without `get_output_embeddings()` / `get_decoder()`, and the MoE router aux loss (`compute_aux_loss`).

Where it saves memory. TRL 1.16 already avoids the full `B×T×V` logits: its fused head folds `4096 tokens × 32768
vocab` tiles into an online log-sum-exp. On devices without Triton (CPU) it scores every position, prompt
included, and its torch fallback holds a few fp32 copies of a tile (`min(B·(T−1), 4096) × min(V, 32768)`), i.e.
roughly one full fp32 logits tensor for short batches; with Triton (CUDA) it scores only the completion tokens and
works in place, so its head costs about one `4096 × 32768` bf16 tile (256 MiB). This path's head costs
`~5 × logps_chunk_size × V × 4` bytes on any device (e.g. 128 rows, V = 152k: ~0.4 GB; 32 rows: ~0.1 GB), at the
price of one more LM-head matmul per chunk in the backward (the checkpoint recompute). On CUDA it therefore beats
TRL's head only with small chunks (≲ 100 rows at V = 152k). Measured on CPU (vocab 152k,
8 × (64 + 256) tokens, full fine-tuning; `benchmarks/results/chunked_logps.md`): loss-step peak 0.05× plain TRL 1.16
at 32 rows per chunk, 0.12× at 128, 0.45× at 512 (≈ 4·chunk·V·4 bytes + ~0.1 GB); the full-logits head the
memory facts file models is 1.77× TRL there. Not measured on a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

FLAG = "logps_chunk_size"
_KWARG = "groupx_chunked_logps"  # the keyword routed through the model wrappers to the patched forward


@dataclass
class ChunkedLogpsArgs:
    """
    logps_chunk_size (`int` or `None`, *optional*, defaults to `None`):
        Compute per-token log-probs (and entropies) from the final hidden states, applying the LM head to this many
        completion tokens at a time under activation checkpointing, so that at most one `logps_chunk_size × vocab`
        block of logits exists in forward or backward. `None` (default) keeps TRL's fused LM head unchanged.
        Costs one extra LM-head matmul per chunk in the backward. Text-only causal LMs; see
        `trl_groupx/memory/chunked_logps.py` for what is supported and what it saves against TRL 1.16.
    """

    logps_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Chunked log-probs: completion tokens per LM-head chunk (activation-checkpointed), so the full "
            "logits never exist. None keeps TRL's fused LM head."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        size = self.logps_chunk_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"{FLAG}={size!r} must be a positive integer (tokens per LM-head chunk) or None.")


@dataclass(frozen=True)
class _Request:
    logits_to_keep: int
    chunk_size: int
    temperature: float
    compute_entropy: bool
    cast_lm_head_to_fp32: bool


def logit_transform(config) -> tuple[float, float | None]:
    """(logit scale, final logit soft-cap) of a model config, read as TRL 1.16's `add_fused_lm_head` reads them."""
    text_config = config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    scale = getattr(text_config, "logit_scale", None)
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:
        scaling = text_config.logits_scaling
        scale = scaling if text_config.model_type == "hyperclovax" else 1 / scaling
    return (1.0 if scale is None else scale), softcap


def chunked_token_logps(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    upcast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `targets` (and entropy) under `lm_head(hidden)`, `chunk_size` rows at a time.

    Args:
        hidden: `(N, H)` final hidden states of the positions that predict `targets`.
        targets: `(N,)` token ids.
        lm_head: the output-embedding module (a plain `nn.Linear`, or PEFT's LoRA wrapper around it).
        chunk_size: rows per chunk; each chunk runs under non-reentrant activation checkpointing when gradients are
            on, so the backward recomputes its logits instead of keeping them.
        temperature, logit_scale, softcap: `z = softcap·tanh(scale·logits / softcap) / temperature` (TRL's order).
        upcast: run the head in float32 outside autocast (`cast_lm_head_to_fp32`).

    Returns `(N,)` float32 log-probs and, with `compute_entropy`, `(N,)` float32 entropies (else `None`).
    """
    if hidden.size(0) == 0:  # keep the (empty) output connected to the graph
        empty = hidden.sum(-1).float()
        return empty, (empty if compute_entropy else None)

    def head(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if upcast:
            with torch.autocast(h.device.type, enabled=False):
                z = lm_head(h.float())
        else:
            z = lm_head(h)
        z = z.float()
        if logit_scale != 1.0:
            z = z * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        if temperature != 1.0:
            z = z / temperature
        logp_all = z.log_softmax(-1)
        logp = logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        if not compute_entropy:
            return (logp,)
        return logp, -(logp_all.exp() * logp_all).sum(-1)

    use_checkpoint = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters())
    )
    outs = []
    for start in range(0, hidden.size(0), chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if use_checkpoint:
            outs.append(checkpoint(head, h, t, use_reentrant=False, preserve_rng_state=False))
        else:
            outs.append(head(h, t))
    logps = torch.cat([o[0] for o in outs])
    entropies = torch.cat([o[1] for o in outs]) if compute_entropy else None
    return logps, entropies


def check_supported(model, multimodal: dict[str, Any] | None = None, compute_aux_loss: bool = False) -> None:
    """Raise a `ValueError` naming `logps_chunk_size` for what the chunked path does not handle."""
    check_text_lm_with_head(model, FLAG, multimodal, compute_aux_loss)


def check_text_lm_with_head(
    model, flag: str, multimodal: dict[str, Any] | None = None, compute_aux_loss: bool = False
) -> None:
    """What every hidden-state log-prob path (`logps_chunk_size`, `prefix_grouper`) needs: text-only inputs, no MoE
    aux loss, and a text causal LM with a separate decoder body and LM head. Raises `ValueError` naming `flag`."""
    if any(v is not None for v in (multimodal or {}).values()):
        raise ValueError(f"{flag} supports text-only inputs; multimodal inputs were passed. Unset {flag}.")
    if compute_aux_loss:
        raise ValueError(f"{flag} does not compute the MoE router aux loss; unset {flag} or router_aux_loss_coef.")
    config = getattr(model, "config", None)
    if config is None or config.get_text_config() is not config:
        raise ValueError(f"{flag} supports text-only causal LMs; {type(model).__name__} is multimodal. Unset {flag}.")
    try:
        lm_head, decoder = model.get_output_embeddings(), model.get_decoder()
    except (AttributeError, NotImplementedError):
        lm_head = decoder = None
    if lm_head is None or decoder is None or decoder is model:
        raise ValueError(
            f"{flag} needs a model with a separate decoder body and LM head (get_decoder() / "
            f"get_output_embeddings()); {type(model).__name__} has none. Unset {flag}."
        )


def install(model) -> None:
    """Patch `model.forward` (a `PreTrainedModel`, inside any PEFT/DDP wrapper) to honour the chunked keyword.

    Idempotent. Without the keyword the previous forward (TRL's fused one, or the model's own) runs unchanged.
    """
    if getattr(model, "_groupx_chunked_logps_installed", False):
        return
    check_supported(model)
    previous = model.forward
    logit_scale, softcap = logit_transform(model.config)

    @functools.wraps(previous)
    def forward(*args, **kwargs):
        request: _Request | None = kwargs.pop(_KWARG, None)
        if request is None:
            return previous(*args, **kwargs)
        return _chunked_forward(model, request, logit_scale, softcap, **kwargs)

    model.forward = forward
    model._groupx_chunked_logps_installed = True


def _chunked_forward(model, request: _Request, logit_scale, softcap, input_ids, attention_mask, **kwargs):
    # PEFT's forward adds `labels=None`, `inputs_embeds=None`, ...: the decoder body takes none of them
    kwargs = {k: v for k, v in kwargs.items() if v is not None and k not in ("labels", "return_dict")}
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    hidden = hidden.last_hidden_state
    keep = min(request.logits_to_keep, input_ids.size(1) - 1)  # TRL returns at most T − 1 positions
    lm_head = model.get_output_embeddings()
    device = lm_head.weight.device
    states = hidden[:, -keep - 1 : -1].to(device)
    targets = input_ids[:, -keep:].to(device)
    mask = attention_mask[:, -keep:].to(device) != 0  # TRL: padded targets are −100 → 0 in both outputs
    logps, entropies = chunked_token_logps(
        states[mask], targets[mask], lm_head, chunk_size=request.chunk_size, temperature=request.temperature,
        compute_entropy=request.compute_entropy, logit_scale=logit_scale, softcap=softcap,
        upcast=request.cast_lm_head_to_fp32,
    )
    scatter = lambda x: x.new_zeros(mask.shape).masked_scatter(mask, x)
    return scatter(logps), (scatter(entropies) if entropies is not None else None)


def chunked_per_token_logps_and_entropies(
    trainer, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
    compute_aux_loss=False, **multimodal,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """Drop-in for TRL 1.16's `GRPOTrainer._get_per_token_logps_and_entropies` (same arguments, same outputs,
    same `batch_size` micro-batching) computed with `chunked_token_logps`."""
    from accelerate.utils import is_peft_model

    inner = trainer.accelerator.unwrap_model(model)
    inner = inner.get_base_model() if is_peft_model(inner) else inner
    check_supported(inner, multimodal, compute_aux_loss)
    install(inner)
    request = _Request(
        logits_to_keep=logits_to_keep, chunk_size=trainer.args.logps_chunk_size, temperature=trainer.temperature,
        compute_entropy=compute_entropy,
        cast_lm_head_to_fp32=bool(getattr(trainer.args, "cast_lm_head_to_fp32", False)),
    )
    return micro_batched_forward(trainer, model, input_ids, attention_mask, batch_size, {_KWARG: request},
                                 compute_entropy)


def micro_batched_forward(trainer, model, input_ids, attention_mask, batch_size, extra: dict, compute_entropy: bool):
    """TRL's `batch_size` micro-batching around a patched `model(...)` call that returns `(logps, entropies)`
    (the patch reads its request from `extra`); returns TRL's `(logps, entropies, aux_loss=None)`."""
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        end = min(start + batch_size, input_ids.size(0))
        with trainer.accelerator.autocast():
            logps, entropies = model(input_ids=input_ids[start:end], attention_mask=attention_mask[start:end], **extra)
        all_logps.append(logps)
        if compute_entropy:
            all_entropies.append(entropies)
    return torch.cat(all_logps), (torch.cat(all_entropies) if compute_entropy else None), None
