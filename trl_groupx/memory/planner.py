"""Peak GPU memory of single-GPU GRPO with TRL (LoRA/QLoRA/full fine-tuning, vLLM colocate/server or HF generate).

The model is the first-principles one of the facts file `single-gpu-memory.md` §4 (see `docs/memory.md`): every
term is linear in `B·T` or `B·T_c` and its constants were checked against reported runs (tests/unit/memory).
All sizes are bytes; GiB = 2**30 bytes. Nothing here imports torch or touches a GPU.

Term by term (notation of the facts file: `P` params, `L` layers, `H` hidden, `q`/`kv` attention widths, `I` MLP
width, `V` vocab, `r` LoRA rank, `B` per_device_train_batch_size, `T_p`/`T_c` prompt/completion lengths):

* weights: `2P` (bf16), `4P` (fp32), NF4 `P_lin·0.5625 + b·(P−P_lin)` (0.516 with double quant),
  FP8 `P_lin + 2(P−P_lin)`.
* adapter + optimizer: LoRA `N_lora·(16 | 10 with 8-bit Adam | 8 for TRL's bf16 QLoRA cast)`; full fine-tuning:
  gradients + two Adam states in the weight dtype (1 byte each with 8-bit Adam).
* activations: GC on `2·B·T·H·L + 2·B·T·k_layer`; GC off `2·B·T·L·k_layer`; `k_layer = 4H+2q+2kv+4I` (+q+kv with
  q/k-norm, +5H+q+I with LoRA dropout, 2I instead of 4I with fused Liger kernels). fp32 activations double it.
  With `prefix_grouper` (trl_groupx shared-prefix forward, GC off): `2·L·((U·T_p + B·T_c)·k_layer + B·T_p·2·kv)`,
  `U` distinct prompts per micro-batch (`prompts_per_micro_batch`); its no-grad pass also holds all B rows' cache.
* log-prob head (`logprob_head`): "trl-fused" (default; TRL 1.16 always patches GRPO's model with its fused,
  tiled LM head: hidden copy + fp32 gradient `B·T_c·H·(2+4+2)` + one 4096×32768 tile — no `B×T×V` tensor);
  "unfused" (the facts file's model of older TRL: `B·(T_c+1)·V·b_l·c + (T_c+1)·V·4`, `b_l = 2`, `c = 2`);
  "liger" (Liger's fused GRPO loss: `V·H·6 + B·T_c·H·6 + 0.13 GB`); with `logps_chunk_size` (trl_groupx chunked
  log-probs) `5·chunk·V·4 + B·T_c·H·6`.
* no-grad log-prob pass (old log-probs with vLLM IS correction / num_iterations>1 / steps_per_generation>GA, ref
  log-probs with beta>0): one layer's intermediates + the head's forward, transient; the training peak takes the
  larger of it and activations + head.
* vLLM colocate: its whole budget `u·M` = weights + profile activations + CUDA graphs + non-torch + KV cache.
  With sleep mode (level 2, TRL) vLLM holds only a small residual while training; generation needs `u·M` while the
  trainer holds only its weights and optimizer states.
* transformers generate (no vLLM): KV cache of the generation batch + one layer of prefill activations; with
  `generation_micro_group_size=k` (trl_groupx micro sampling groups) of at most k sequences.
* fragmentation: the transient terms times `fragmentation` (1.1); CUDA context `cuda_context_gib` (0.5 GiB).
* dGRPO teacher (`teacher`, trl_groupx `opd_teacher_model`): its weights in the policy's dtype (bf16 under a 4-bit
  or FP8 policy), resident; its no-grad log-prob pass (TRL's path: one layer + the head, as above, with the
  teacher's sizes) is transient, taken as the larger of it and the training step's activations + head. RTO's DPO
  model (trl_groupx `rto_dpo_model`) is loaded and run the same way and planned as this teacher (one of the two).
* SPPO's value model (`value_model`, trl_groupx `sppo_value_model` with `advantage_estimator="sppo"`;
  `advantages/sppo_value.py`): a `*ForTokenClassification` model with one label, float32, with its own AdamW:
  `P_v = P − embedding_params + V·H + H + 1` parameters (backbone with one embedding matrix, no `lm_head`, a scalar
  head with bias), resident `P_v·(4 + 8)` (weights + two fp32 Adam states). Its BCE update, once per generation
  batch and never at the same time as the policy's backward, is transient: fp32 gradients `4·P_v` (set to None
  after each step), under bf16 autocast the bf16 copies autocast caches of its linear weights `2·(P_lin,v + H)`,
  and the activations of one micro-batch of `B` prompts of `T_p` tokens without gradient checkpointing
  `e·B·T_p·L_v·k_layer,v` (`k_layer` without LoRA or Liger terms; `e` = 2 under bf16 autocast, else 4).
* S2L-PO's explorer (`explorer`, trl_groupx `s2l_po_explorer_model` with `rollout_filter="s2l_po"`): a frozen model
  loaded like dGRPO's teacher (weights in the policy's float dtype, resident); on explorer batches transformers
  `generate()` runs on it, so the generation peak takes the larger of the policy's and the explorer's KV cache +
  prefill (same sequences per call, the explorer's sizes). S2L-PO refuses vLLM.
* logit averaging (`logit_avg`, `rollout_filter="logit_avg"`): under full fine-tuning a frozen copy of the policy
  in its dtype, `W`, next to TRL's own reference when `beta != 0`; nothing under LoRA (the adapter is disabled).
  Its log-prob forwards read plain logits of both models (`sampling/logit_averaging.py`), so the log-prob head is
  `B·(T_c+1)·V·(2·b_l + 20)` in place of TRL's fused head: the policy's and the reference's logits, the float32
  mix, its tempered copy and log-softmax, and the entropy's two float32 temporaries (`2·b_l + 12` in a no-grad
  pass, which computes no entropy); and `generate()` runs the reference beside the policy with its own KV cache,
  a second `KV cache + prefill` at the generation peak.
* SRPO (`srpo_distill_topk`, trl_groupx `loss_type="srpo"`; `objective/self_teacher.py`): the generation batch's
  teacher targets, kept until the next generation batch replaces them (TRL still holds them while it generates
  that one), so resident: `N·T_c·k·(8 + 4) + N·T_c·4 + N` bytes (int64 top-k ids, fp32 top-k log-probs, fp32
  entropy weights, bool routing; `N = B·steps_per_generation`, `k = min(srpo_distill_topk, V)`); and the
  self-teacher: under full fine-tuning a frozen copy in the policy's dtype `W` (`srpo_teacher_kind` "ema" or
  "base"), under LoRA with "ema" a second adapter and TRL's shadow copy of it, `N_lora·(4 + 4)` (`N_lora·(4 + 2)`
  under QLoRA, whose student adapter, hence the shadow, is bf16); "live", and "base" under LoRA, add nothing.
  The student's forward on a micro-batch with routed rows keeps the plain `(B, T_c+1, V)` logits and, in the
  backward, their gradient, plus one row's float32 head under activation checkpointing (tempered copy,
  log-softmax, gradient: `3·T_c·V·4`): `B·(T_c+1)·V·2·b_l + 12·T_c·V`, taken when larger than the fused head.
  The teacher's no-grad pass after each generation (`_teacher_topk`) is a no-grad pass with plain logits
  (`B·(T_c+1)·V·b_l + (T_c+1)·V·4`) and four more float32 row copies (tempered, log-softmax, exp, product).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .architectures import Architecture, resolve_architecture

GiB = 2**30
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_DEFAULT_TARGETS = ("q_proj", "v_proj")  # peft's default for Llama/Qwen when target_modules is None
NF4_BYTES = 4.5 / 8  # 4-bit + fp32 absmax per block of 64
NF4_DQ_BYTES = 4.127 / 8  # with bnb double quantisation
LIGER_TILE_BYTES = 0.13e9  # facts §4.2 (4): ~2048×4096 fp32 ×4
TRL_TOKEN_TILE = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE (TRL 1.16)
TRL_VOCAB_TILE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE (TRL 1.16)
LOGPROB_HEADS = ("trl-fused", "unfused", "liger")
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "fp8": 1}
VLLM_MODES = ("colocate", "server")
SRPO_TEACHER_KINDS = ("ema", "live", "base")


_HEAD_LABEL = {"trl-fused": "log-prob head (TRL fused tiles)", "unfused": "log-prob head (B x T_c x V logits)",
               "liger": "log-prob head (Liger fused loss)"}


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


@dataclass(frozen=True)
class PlanInputs:
    """Every setting the planner reads (see `plan_memory` for their meaning). Frozen so suggestions can re-run it."""

    arch: Architecture
    use_peft: bool = True
    lora_r: int = 16
    lora_target_modules: tuple[str, ...] | str | None = "all-linear"
    lora_dropout: float = 0.0
    load_in_4bit: bool = False
    bnb_double_quant: bool = False
    weight_dtype: str = "bfloat16"
    bf16: bool = True
    optim: str = "adamw_torch"
    num_generations: int = 8
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    steps_per_generation: int = 1
    prompt_length: int = 512
    completion_length: int = 1024
    gradient_checkpointing: bool = True
    use_liger_kernel: bool = False
    cast_lm_head_to_fp32: bool = False
    logprob_head: str = "trl-fused"
    logps_chunk_size: int | None = None
    prefix_grouper: bool = False  # shared-prefix forward (trl_groupx/memory/prefix_grouper.py); needs GC off
    generation_micro_group_size: int | None = None  # micro sampling groups (trl_groupx/sampling/micro_groups.py)
    beta: float = 0.0
    num_iterations: int = 1
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_enable_sleep_mode: bool = False
    vllm_max_model_length: int | None = None
    vllm_importance_sampling_correction: bool = True
    vllm_enforce_eager: bool = False
    gpu_memory_gib: float = 40.0
    usable_fraction: float = 0.989
    margin: float = 0.10
    # calibration constants (facts §4.2; calibrate with benchmarks/gpu when a GPU is lent)
    logits_copies: float = 2.0
    fragmentation: float = 1.1
    cuda_context_gib: float = 0.5
    vllm_profile_gib: float = 1.2
    vllm_cuda_graph_gib: float = 0.5
    vllm_nontorch_gib: float = 0.1
    vllm_sleep_residual_gib: float = 0.2
    kv_cache_dtype_bytes: int = 2
    teacher: Architecture | None = None  # dGRPO's frozen teacher (trl_groupx `opd_teacher_model`)
    value_model: Architecture | None = None  # SPPO's value model (trl_groupx `sppo_value_model`)
    explorer: Architecture | None = None  # S2L-PO's frozen explorer (trl_groupx `s2l_po_explorer_model`)
    logit_avg: bool = False  # logit-averaged reference anchoring (trl_groupx `rollout_filter="logit_avg"`)
    srpo_distill_topk: int | None = None  # SRPO (trl_groupx `loss_type="srpo"`): k of its teacher targets; None = off
    srpo_teacher_kind: str = "ema"  # SRPO's self-teacher: "ema", "live" or "base"


@dataclass
class Suggestion:
    """One changed setting (or a combination), and the plan the planner computed with it."""

    description: str
    changes: dict[str, Any]
    peak: int
    verdict: str
    detail: str = ""

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"


@dataclass
class MemoryPlan:
    """Peak breakdown (bytes), verdict and suggestions for one single-GPU GRPO setting."""

    inputs: PlanInputs
    gpu_bytes: int
    usable_bytes: int
    # trainer
    weights: int
    adapter_optimizer: int
    reference_model: int
    activations: int
    logprob_head: int
    nograd_logprobs: int
    quant_transient: int
    fragmentation: int
    cuda_context: int
    # generation
    vllm_budget: int  # u·M held by vLLM while it is awake (0 without colocated vLLM)
    vllm_weights: int
    vllm_overhead: int  # profile activations + CUDA graphs + non-torch memory
    vllm_kv_cache: int
    vllm_resident_training: int  # what vLLM holds during the training step (budget, or the sleep residual)
    hf_generation: int  # transformers generate: KV cache + prefill activations
    # totals
    train_peak: int
    generation_peak: int
    peak: int
    phase: str
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len: int | None
    concurrent_sequences: int
    generation_batch: int
    verdict: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suggestions: list[Suggestion] = field(default_factory=list)
    teacher_model: int = 0  # dGRPO teacher weights
    teacher_logprobs: int = 0  # its no-grad log-prob pass (transient)
    value_model: int = 0  # SPPO value model: fp32 weights + AdamW states (resident)
    value_update: int = 0  # its BCE update: fp32 gradients + autocast weight copies + activations (transient)
    explorer_model: int = 0  # S2L-PO explorer weights (resident)
    explorer_generation: int = 0  # generate() on the explorer: KV cache + prefill with its sizes
    logit_avg_reference: int = 0  # logit averaging's frozen copy of the policy (full fine-tuning)
    srpo_teacher: int = 0  # SRPO self-teacher: frozen copy (full fine-tuning) or EMA adapter + shadow (LoRA)
    srpo_targets: int = 0  # SRPO teacher top-k targets of the generation batch (resident)
    logit_avg_generation: int = 0  # generate(): the logit-averaging reference's own KV cache + prefill
    srpo_teacher_pass: int = 0  # SRPO's no-grad teacher pass after each generation (transient)

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    @property
    def headroom(self) -> int:
        """Usable GPU bytes left at the peak (negative when it does not fit)."""
        return self.usable_bytes - self.peak

    @property
    def logits_bytes_per_copy(self) -> int:
        """One copy of the completion logits `B·(T_c+1)·V·b_l` (the term users see in OOM traces)."""
        i = self.inputs
        return i.per_device_train_batch_size * (i.completion_length + 1) * i.arch.vocab_size * _logit_bytes(i)

    def breakdown(self) -> list[tuple[str, int]]:
        rows = [
            ("policy weights", self.weights),
            ("adapter + optimizer states" if self.inputs.use_peft else "gradients + optimizer states",
             self.adapter_optimizer),
        ]
        if self.reference_model:
            rows.append(("reference model", self.reference_model))
        if self.teacher_model:
            rows.append(("teacher model (dGRPO, frozen)", self.teacher_model))
        if self.value_model:
            rows.append(("value model + AdamW (SPPO, fp32)", self.value_model))
        if self.explorer_model:
            rows.append(("explorer model (S2L-PO, frozen)", self.explorer_model))
        if self.logit_avg_reference:
            rows.append(("logit-averaging reference (frozen copy)", self.logit_avg_reference))
        if self.srpo_teacher:
            rows.append(("SRPO self-teacher (" + ("EMA adapter + shadow)" if self.inputs.use_peft else
                                                  f"{self.inputs.srpo_teacher_kind} copy)"), self.srpo_teacher))
        if self.srpo_targets:
            rows.append(("SRPO teacher top-k targets (generation batch)", self.srpo_targets))
        rows += [
            ("activations (one micro-batch" + (", shared prefix)" if self.inputs.prefix_grouper else ")"),
             self.activations),
            (_HEAD_LABEL.get(self.inputs.logprob_head, "log-prob head") if not self.inputs.logps_chunk_size
             else "log-prob head (chunked)", self.logprob_head),
        ]
        if self.nograd_logprobs:
            rows.append(("no-grad log-prob pass (max with act.+head)", self.nograd_logprobs))
        if self.teacher_logprobs:
            rows.append(("teacher log-prob pass (max with act.+head)", self.teacher_logprobs))
        if self.value_update:
            rows.append(("SPPO value update (max with act.+head)", self.value_update))
        if self.srpo_teacher_pass:
            rows.append(("SRPO teacher top-k pass (max with act.+head)", self.srpo_teacher_pass))
        if self.quant_transient:
            rows.append(("4-bit dequantisation buffer", self.quant_transient))
        rows.append(("allocator fragmentation", self.fragmentation))
        rows.append(("CUDA context", self.cuda_context))
        if self.vllm_budget:
            rows += [
                ("vLLM weights", self.vllm_weights),
                ("vLLM profile + CUDA graphs + other", self.vllm_overhead),
                ("vLLM KV cache", self.vllm_kv_cache),
            ]
        if self.hf_generation:
            rows.append(("generate(): KV cache + prefill", self.hf_generation))
        if self.logit_avg_generation:
            rows.append(("generate(): logit-averaging reference KV cache + prefill", self.logit_avg_generation))
        if self.explorer_generation:
            rows.append(("generate() on the explorer (max with above)", self.explorer_generation))
        return rows

    def report(self) -> str:
        return format_report(self)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("inputs", "suggestions")}
        out["model"] = self.inputs.arch.name
        out["settings"] = {k: v for k, v in dataclasses.asdict(self.inputs).items() if k != "arch"}
        out["headroom"] = self.headroom
        out["suggestions"] = [dataclasses.asdict(s) for s in self.suggestions]
        return out


# ----------------------------------------------------------------------------------------------------------------
# terms


def _dtype_bytes(dtype: str, what: str) -> int:
    key = str(dtype).replace("torch.", "").lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"{what}={dtype!r} is not a dtype the planner knows; use one of {sorted(DTYPE_BYTES)}.")
    return DTYPE_BYTES[key]


def weight_bytes(arch: Architecture, fmt: str, *, double_quant: bool = False, other_bytes: int = 2) -> int:
    """Bytes of one copy of the weights in `fmt` ('nf4', 'fp8' or a dtype name), facts §4.2 (1).

    4-bit and FP8 quantise only the decoder's linear weights; embeddings, `lm_head`, norms and biases stay in
    `other_bytes` per parameter.
    """
    p, p_lin = arch.num_params, arch.linear_params
    if fmt == "nf4":
        return round(p_lin * (NF4_DQ_BYTES if double_quant else NF4_BYTES) + other_bytes * (p - p_lin))
    if fmt == "fp8":
        return p_lin + other_bytes * (p - p_lin)
    return _dtype_bytes(fmt, "weight dtype") * p


def lora_params(arch: Architecture, r: int, targets) -> int:
    """`N_lora = r·Σ(in+out)` over the adapted projections of every layer (all-linear: `r·L·(7H+2q+2kv+3I)`)."""
    h, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    dims = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
            "up_proj": h + i, "down_proj": i + h}
    return r * arch.num_layers * sum(dims[t] for t in _targets(targets))


def _targets(targets) -> tuple[str, ...]:
    if targets is None:
        return PEFT_DEFAULT_TARGETS
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",")] if targets != "all-linear" else ["all-linear"]
    out: list[str] = []
    for t in targets:
        if t == "all-linear":
            out.extend(ALL_LINEAR)
        elif t in ALL_LINEAR:
            out.append(t)
        else:
            raise ValueError(f"lora_target_modules: {t!r} is not a Llama/Qwen projection; use 'all-linear' or "
                             f"names from {list(ALL_LINEAR)}.")
    return tuple(dict.fromkeys(out))


def k_layer(i: PlanInputs) -> int:
    """Elements saved per token and layer for backward (facts §4.2 (3))."""
    a = i.arch
    h, q, kv, inter = a.hidden_size, a.q_dim, a.kv_dim, a.intermediate_size
    k = 4 * h + 2 * q + 2 * kv + (2 if i.use_liger_kernel else 4) * inter
    if a.qk_norm:
        k += q + kv
    if i.use_peft and i.lora_dropout > 0:
        dims = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h, "down_proj": inter}
        k += sum(dims[t] for t in _targets(i.lora_target_modules))
    return k


def _act_bytes(i: PlanInputs) -> int:
    w = _dtype_bytes(i.weight_dtype, "weight_dtype") if i.weight_dtype not in ("nf4", "fp8") else 2
    return 2 if (i.bf16 or w == 2) else 4


def _logit_bytes(i: PlanInputs) -> int:
    return 4 if i.cast_lm_head_to_fp32 else _act_bytes(i)


def checkpoint_bytes(i: PlanInputs) -> int:
    """Layer-boundary checkpoints kept with gradient checkpointing: `2·B·T·H·L` (0 without it)."""
    if not i.gradient_checkpointing:
        return 0
    return _act_bytes(i) * i.per_device_train_batch_size * (i.prompt_length + i.completion_length) * \
        i.arch.hidden_size * i.arch.num_layers


def prompts_per_micro_batch(i: PlanInputs) -> int:
    """`U`, the distinct prompts in one training micro-batch, as the shared-prefix forward encodes them.

    With `steps_per_generation == 1` the micro-batch is the whole (shuffled) generation batch, so it holds whole
    groups: `U = B / G`. Otherwise TRL shuffles the generation batch before cutting it into micro-batches and a
    group's rows can land in several of them. Choice: plan the worst case, `U = min(B, B·steps_per_generation / G)`
    (every row of the micro-batch from another group, as far as there are groups), since the planner bounds the peak.
    """
    b, g = i.per_device_train_batch_size, i.num_generations
    if i.steps_per_generation == 1:
        return max(b // g, 1)
    return min(b, max(b * i.steps_per_generation // g, 1))


def activation_bytes(i: PlanInputs) -> int:
    """Training activations of one micro-batch: checkpoints + one recomputed layer (GC), or all layers (no GC).

    With `prefix_grouper` (GC off) the prompt goes through the layers once per distinct prompt, the completions once
    per row, and each row's attention keeps the expanded prompt keys/values it attends to:
    `e·L·((U·T_p + B·T_c)·k_layer + B·T_p·2·kv)`, `U` = `prompts_per_micro_batch`.
    """
    b, t, a = i.per_device_train_batch_size, i.prompt_length + i.completion_length, i.arch
    e = _act_bytes(i)
    if i.gradient_checkpointing:
        return checkpoint_bytes(i) + e * b * t * k_layer(i)
    if i.prefix_grouper:
        u, tp, tc = prompts_per_micro_batch(i), i.prompt_length, i.completion_length
        return e * a.num_layers * ((u * tp + b * tc) * k_layer(i) + b * tp * 2 * a.kv_dim)
    return e * b * t * a.num_layers * k_layer(i)


def _head_compute_bytes(i: PlanInputs) -> int:
    return 4 if i.cast_lm_head_to_fp32 else _act_bytes(i)


def logprob_head_bytes(i: PlanInputs) -> int:
    """Grad-path log-prob head of one micro-batch (`N = B·T_c` scored tokens).

    * "trl-fused" (TRL 1.16's `add_fused_lm_head`, CUDA/Triton path, always on in GRPO): the compact hidden copy and
      its fp32 + cast gradient `N·H·(e+4+e)`, one `min(N,4096)×min(V,32768)` tile, nine fp32 per-token vectors, and,
      when `lm_head` trains (full fine-tuning), its fp32 gradient `V·H·4` + cast. No `B×T×V` tensor exists.
    * "unfused" (facts §4.2 (4), TRL before the fused head and the reported runs): `B·(T_c+1)·V·b_l·c` +
      one fp32 row `(T_c+1)·V·4`.
    * "liger" (Liger's fused GRPO loss, older TRL): `V·H·6 + N·H·6 + 0.13 GB`.
    * `logps_chunk_size` (trl_groupx chunked log-probs, trl_groupx/memory/chunked_logps.py): `5·chunk·V·4`, the
      figure that module documents, + the hidden copy and fp32 gradient `N·H·(e+4)`.
    """
    a = i.arch
    b, tc, v, h = i.per_device_train_batch_size, i.completion_length, a.vocab_size, a.hidden_size
    n, e = b * tc, _act_bytes(i)
    if i.logit_avg:  # plain logits of policy and reference, mixed in float32 (sampling/logit_averaging.py)
        return logit_avg_head_bytes(i, entropy=True)
    if i.logps_chunk_size:
        return 5 * i.logps_chunk_size * v * 4 + n * h * (e + 4)
    if i.logprob_head == "liger":
        return round(v * h * 6 + n * h * 6 + LIGER_TILE_BYTES)
    if i.logprob_head == "unfused":
        return round(b * (tc + 1) * v * _logit_bytes(i) * i.logits_copies + (tc + 1) * v * 4)
    ec = _head_compute_bytes(i)
    head = n * h * (ec + 4 + e) + min(n, TRL_TOKEN_TILE) * min(v, TRL_VOCAB_TILE) * ec + 9 * 4 * n
    if not i.use_peft:
        head += v * h * (4 + _dtype_bytes(i.weight_dtype, "weight_dtype"))
    return max(head, srpo_student_head_bytes(i))


def logit_avg_head_bytes(i: PlanInputs, *, entropy: bool) -> int:
    """Logit averaging's log-prob head of one micro-batch: the policy's and the reference's plain logits
    `B·(T_c+1)·V·b_l` each, and float32 `(B, T_c+1, V)` tensors: the mix, its tempered copy, the log-softmax, and
    with `entropy` the entropy's `exp` and product (`sampling/logit_avg.mixed_token_logps`)."""
    b, tc, v = i.per_device_train_batch_size, i.completion_length, i.arch.vocab_size
    return b * (tc + 1) * v * (2 * _logit_bytes(i) + 4 * (3 + (2 if entropy else 0)))


def srpo_student_head_bytes(i: PlanInputs) -> int:
    """SRPO's student head on a micro-batch with routed rows (`objective/self_teacher.student_forward`): the plain
    logits `B·(T_c+1)·V·b_l`, kept for the backward, their gradient as large, and one row's float32 head under
    activation checkpointing (tempered copy, log-softmax, its gradient) `3·T_c·V·4`; 0 without SRPO."""
    if i.srpo_distill_topk is None:
        return 0
    b, tc, v = i.per_device_train_batch_size, i.completion_length, i.arch.vocab_size
    return b * (tc + 1) * v * 2 * _logit_bytes(i) + 3 * tc * v * 4


def srpo_teacher_pass_bytes(i: PlanInputs) -> int:
    """SRPO's teacher pass after each generation (`_teacher_topk`): a no-grad pass with plain logits (one layer's
    intermediates, `B·(T_c+1)·V·b_l + (T_c+1)·V·4`) and four more float32 row copies `4·T_c·V·4` (tempered,
    log-softmax, `exp`, product); 0 without SRPO."""
    if i.srpo_distill_topk is None:
        return 0
    plain = dataclasses.replace(i, logprob_head="unfused", logps_chunk_size=None, prefix_grouper=False,
                                logit_avg=False)
    return _nograd_pass_bytes(plain) + 4 * i.completion_length * i.arch.vocab_size * 4


def _needs_nograd_pass(i: PlanInputs) -> bool:
    old = (i.num_iterations > 1 or i.steps_per_generation > i.gradient_accumulation_steps
           or (i.use_vllm and i.vllm_importance_sampling_correction))
    return old or i.beta != 0


def nograd_logprob_bytes(i: PlanInputs) -> int:
    """Transient of a no-grad log-prob pass (old / reference log-probs): one layer's intermediates + the head."""
    if not _needs_nograd_pass(i):
        return 0
    return _nograd_pass_bytes(i)


def teacher_logprob_bytes(i: PlanInputs) -> int:
    """Transient of dGRPO's no-grad teacher pass: TRL's own log-prob path (never trl_groupx's chunked or
    shared-prefix forward) with the teacher's sizes; 0 without a teacher."""
    if i.teacher is None:
        return 0
    return _nograd_pass_bytes(dataclasses.replace(i, arch=i.teacher, prefix_grouper=False, logps_chunk_size=None))


def value_model_params(arch: Architecture) -> int:
    """`P_v`: parameters of SPPO's value model, `AutoModelForTokenClassification(num_labels=1)` of `arch`: the
    backbone (one embedding matrix, no `lm_head`) and a linear head `H → 1` with bias."""
    return arch.num_params - arch.embedding_params + arch.vocab_size * arch.hidden_size + arch.hidden_size + 1


def value_model_bytes(i: PlanInputs) -> int:
    """SPPO's value model, resident: fp32 weights + AdamW's two fp32 states, `P_v·(4 + 8)`; 0 without one."""
    return 0 if i.value_model is None else value_model_params(i.value_model) * (4 + 8)


def value_update_bytes(i: PlanInputs) -> int:
    """Transient of SPPO's value-model update (`PromptValueModel.update`): fp32 gradients `4·P_v`; under bf16
    autocast the cached bf16 copies of the linear weights (decoder projections + the scalar head) `2·(P_lin + H)`;
    the activations of one micro-batch of `B` prompts (`T_p` tokens, no gradient checkpointing) over its `L`
    layers, `e·B·T_p·L·(4H + 2q + 2kv + 4I [+ q + kv with q/k-norm])`, `e` = 2 under bf16 autocast, else 4. The
    no-grad value forward before it is smaller (no gradients, one layer's intermediates) and not counted."""
    a = i.value_model
    if a is None:
        return 0
    e = 2 if i.bf16 else 4
    h, q, kv, inter = a.hidden_size, a.q_dim, a.kv_dim, a.intermediate_size
    k = 4 * h + 2 * q + 2 * kv + 4 * inter + (q + kv if a.qk_norm else 0)
    casts = 2 * (a.linear_params + h) if i.bf16 else 0
    return 4 * value_model_params(a) + casts + e * i.per_device_train_batch_size * i.prompt_length * a.num_layers * k


def srpo_target_bytes(i: PlanInputs) -> int:
    """SRPO's teacher targets of one per-device generation batch (`N = B·steps_per_generation` rows, `T_c` tokens,
    `k = min(srpo_distill_topk, V)`): int64 top-k ids and fp32 top-k log-probs `N·T_c·k·12`, fp32 entropy weights
    `N·T_c·4`, bool routing `N`; 0 without SRPO."""
    if i.srpo_distill_topk is None:
        return 0
    n, tc = i.per_device_train_batch_size * i.steps_per_generation, i.completion_length
    k = min(i.srpo_distill_topk, i.arch.vocab_size)
    return n * tc * k * (8 + 4) + n * tc * 4 + n


def srpo_teacher_bytes(i: PlanInputs, policy_weights: int) -> int:
    """SRPO's self-teacher: under full fine-tuning a frozen copy of the policy (`policy_weights`) for "ema" and
    "base"; under LoRA with "ema" TRL's second adapter (fp32, peft's adapter dtype) and its shadow copy in the
    student adapter's dtype (bf16 under QLoRA, TRL's cast), `N_lora·(4 + 4 | 2)`; otherwise 0."""
    if i.srpo_distill_topk is None or i.srpo_teacher_kind == "live":
        return 0
    if not i.use_peft:
        return policy_weights
    if i.srpo_teacher_kind != "ema":
        return 0  # "base" under LoRA: the policy with its adapter disabled
    return lora_params(i.arch, i.lora_r, i.lora_target_modules) * (4 + (2 if i.load_in_4bit else 4))


def hf_generation_bytes(i: PlanInputs, arch: Architecture | None = None) -> int:
    """transformers `generate()` on `generation_sequences(i)` sequences of `arch` (default: the policy): KV cache
    `n·T·2·L·kv·e` + one layer of prefill `n·T_p·(H + q + 2kv + 2I)·e`, times the fragmentation factor."""
    a = arch or i.arch
    e, n_seq = _act_bytes(i), generation_sequences(i)
    kv_hf = n_seq * (i.prompt_length + i.completion_length) * 2 * a.num_layers * a.kv_dim * e
    prefill = n_seq * i.prompt_length * (a.hidden_size + a.q_dim + 2 * a.kv_dim + 2 * a.intermediate_size) * e
    return round((kv_hf + prefill) * i.fragmentation)


def _nograd_pass_bytes(i: PlanInputs) -> int:
    a = i.arch
    b, tc, v, h = i.per_device_train_batch_size, i.completion_length, a.vocab_size, a.hidden_size
    n, e, t = b * tc, _act_bytes(i), i.prompt_length + i.completion_length
    per_token = (2 * h + a.q_dim + 2 * a.kv_dim + 2 * a.intermediate_size) * e
    if i.prefix_grouper:  # one layer of the prompt or the completion pass + the key/value cache of all B rows
        tokens = max(prompts_per_micro_batch(i) * i.prompt_length, b * tc)
        layer = tokens * per_token + e * a.num_layers * 2 * a.kv_dim * b * t
    else:
        layer = b * t * per_token
    if i.logit_avg:
        head = logit_avg_head_bytes(i, entropy=False)
    elif i.logps_chunk_size:
        head = 5 * i.logps_chunk_size * v * 4 + n * h * e
    elif i.logprob_head in ("unfused", "liger"):  # facts §4.2 (4): not reduced by Liger
        head = b * (tc + 1) * v * _logit_bytes(i) + (tc + 1) * v * 4
    else:
        ec = _head_compute_bytes(i)
        head = n * h * ec + min(n, TRL_TOKEN_TILE) * min(v, TRL_VOCAB_TILE) * ec + 9 * 4 * n
    return layer + head


def generation_sequences(i: PlanInputs) -> int:
    """Sequences in one transformers `generate()` call: the per-device generation batch `B·steps_per_generation`,
    or at most `generation_micro_group_size` of them (micro sampling groups)."""
    gen_batch = i.per_device_train_batch_size * i.steps_per_generation
    k = i.generation_micro_group_size
    return gen_batch if k is None else min(k, gen_batch)


def _weight_format(i: PlanInputs) -> str:
    return "nf4" if i.load_in_4bit else i.weight_dtype


def _adapter_optimizer_bytes(i: PlanInputs) -> int:
    eight_bit = "8bit" in i.optim
    if i.use_peft:
        n = lora_params(i.arch, i.lora_r, i.lora_target_modules)
        if i.load_in_4bit:  # TRL casts QLoRA adapters to bf16: bf16 weight + grad + states
            per = 2 + 2 + (2 if eight_bit else 4)
        else:  # fp32 adapters (peft autocast_adapter_dtype) + fp32 grad + AdamW states
            per = 4 + 4 + (2 if eight_bit else 8)
        return n * per
    if i.load_in_4bit or i.weight_dtype == "fp8":
        raise ValueError("full fine-tuning of a quantised base is not possible: set use_peft=True (LoRA on the "
                         "4-bit base, i.e. QLoRA) or drop load_in_4bit.")
    w = _dtype_bytes(i.weight_dtype, "weight_dtype")
    return i.arch.num_params * (w + (2 if eight_bit else 2 * w))


def _compute(i: PlanInputs) -> MemoryPlan:
    a = i.arch
    usable = round(i.gpu_memory_gib * GiB * i.usable_fraction)
    nonlin_bytes = _dtype_bytes(i.weight_dtype, "weight_dtype") if i.weight_dtype not in ("nf4", "fp8") else 2
    w = weight_bytes(a, _weight_format(i), double_quant=i.bnb_double_quant, other_bytes=nonlin_bytes)
    s = _adapter_optimizer_bytes(i)
    ref = w if (i.beta != 0 and not i.use_peft) else 0
    act = activation_bytes(i)
    head = logprob_head_bytes(i)
    nograd = nograd_logprob_bytes(i)
    # dGRPO's teacher is loaded in the policy's dtype: bf16 under a 4-bit or FP8 policy (their float dtype)
    teacher_fmt = i.weight_dtype if i.weight_dtype not in ("nf4", "fp8") else "bfloat16"
    teacher_w = 0 if i.teacher is None else weight_bytes(i.teacher, teacher_fmt)
    teacher_pass = teacher_logprob_bytes(i)
    value_w, value_pass = value_model_bytes(i), value_update_bytes(i)
    # S2L-PO's explorer is loaded as dGRPO's teacher is (`objective.dgrpo.load_frozen_model`)
    explorer_w = 0 if i.explorer is None else weight_bytes(i.explorer, teacher_fmt)
    logit_ref = w if (i.logit_avg and not i.use_peft) else 0
    srpo_teacher, srpo_targets = srpo_teacher_bytes(i, w), srpo_target_bytes(i)
    quant = 2 * a.hidden_size * a.intermediate_size if i.load_in_4bit else 0
    srpo_pass = srpo_teacher_pass_bytes(i)
    transient = max(act + head, nograd, teacher_pass, value_pass, srpo_pass) + quant
    frag = round(transient * (i.fragmentation - 1))
    ctx = round(i.cuda_context_gib * GiB)
    kv_bpt = 2 * a.num_layers * a.kv_dim * i.kv_cache_dtype_bytes
    gen_batch = i.per_device_train_batch_size * i.steps_per_generation
    t_total = i.prompt_length + i.completion_length
    problems: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []

    vllm_budget = vllm_w = vllm_over = vllm_kv = resident = hf_gen = explorer_gen = logit_avg_gen = 0
    kv_tokens = 0
    max_model_len: int | None = None
    colocate = i.use_vllm and i.vllm_mode == "colocate"
    if colocate:
        u = i.vllm_gpu_memory_utilization
        vllm_budget = round(u * usable)
        vllm_fmt = "nf4" if i.load_in_4bit else ("fp8" if i.weight_dtype == "fp8" else a.torch_dtype)
        if vllm_fmt not in ("nf4", "fp8") and vllm_fmt not in DTYPE_BYTES:
            vllm_fmt = "bfloat16"
        vllm_w = weight_bytes(a, vllm_fmt, double_quant=i.bnb_double_quant)
        graphs = 0 if i.vllm_enforce_eager else i.vllm_cuda_graph_gib
        vllm_over = round((i.vllm_profile_gib + graphs + i.vllm_nontorch_gib) * GiB)
        vllm_kv = vllm_budget - vllm_w - vllm_over
        kv_tokens = max(vllm_kv, 0) // kv_bpt
        max_model_len = i.vllm_max_model_length or a.max_position_embeddings
        if vllm_kv <= 0:
            problems.append(
                f"vLLM cannot start: vllm_gpu_memory_utilization={u:g} gives {gib(vllm_budget):.2f} GiB, less than "
                f"its weights + overheads ({gib(vllm_w + vllm_over):.2f} GiB)."
            )
        elif kv_tokens < max_model_len:
            fix = ("set vllm_max_model_length to prompt + completion length "
                   f"({t_total})" if i.vllm_max_model_length is None else "raise vllm_gpu_memory_utilization")
            problems.append(
                f"vLLM refuses to start: its KV cache holds {kv_tokens:,} tokens, less than one max_model_len="
                f"{max_model_len:,} sequence ('The model's max seq len ... is larger than the maximum number of "
                f"tokens that can be stored in KV cache'); {fix}."
            )
        elif kv_tokens < gen_batch * t_total:
            warnings.append(
                f"vLLM KV cache holds {kv_tokens // t_total} of the {gen_batch} sequences of a generation batch at "
                f"full length: vLLM queues the rest (slower, not an OOM)."
            )
        if max_model_len < t_total:
            warnings.append(f"max_model_len={max_model_len} < prompt + completion ({t_total}): vLLM truncates.")
        if i.vllm_enable_sleep_mode:
            resident = round(i.vllm_sleep_residual_gib * GiB)
        else:
            resident = vllm_budget
    elif i.use_vllm:
        notes.append("vllm_mode='server': generation runs on another GPU; only the trainer is planned here.")
    else:
        # transformers generate() on the whole generation batch, or on `generation_micro_group_size` sequences at a
        # time: KV cache (weight dtype) + one layer of prefill; S2L-PO's explorer batches run it on the explorer
        hf_gen = hf_generation_bytes(i)
        explorer_gen = 0 if i.explorer is None else hf_generation_bytes(i, i.explorer)
        logit_avg_gen = hf_generation_bytes(i) if i.logit_avg else 0  # the reference's own KV cache + prefill

    base = w + s + ref + teacher_w + value_w + explorer_w + logit_ref + srpo_teacher + srpo_targets + ctx
    train_peak = base + resident + transient + frag
    if colocate:
        generation_peak = base + vllm_budget
    else:
        generation_peak = base + max(hf_gen + logit_avg_gen, explorer_gen)
    peak = max(train_peak, generation_peak)
    phase = "training step" if train_peak >= generation_peak else "generation"

    if peak > usable or problems:
        verdict = "does not fit"
    elif peak > usable * (1 - i.margin):
        verdict = "tight"
    else:
        verdict = "fits"
    if colocate and kv_tokens:
        concurrent = kv_tokens // t_total
    else:
        concurrent = gen_batch if not i.use_vllm else 0
    if i.weight_dtype == "float32" and not i.use_peft:
        notes.append("fp32 full fine-tuning: autocast weight copies and fp32 residual streams (up to 1.5-2x on "
                     "activations) are not modelled.")
    if i.load_in_4bit and colocate:
        notes.append("QLoRA + vLLM: TRL loads the base in bitsandbytes 4-bit in vLLM too and merges the adapter "
                     "into it (lossy, slower decode).")
    return MemoryPlan(
        inputs=i, gpu_bytes=round(i.gpu_memory_gib * GiB), usable_bytes=usable, weights=w, adapter_optimizer=s,
        reference_model=ref, activations=act, logprob_head=head, nograd_logprobs=nograd, quant_transient=quant,
        fragmentation=frag, cuda_context=ctx, vllm_budget=vllm_budget, vllm_weights=vllm_w, vllm_overhead=vllm_over,
        vllm_kv_cache=max(vllm_kv, 0), vllm_resident_training=resident, hf_generation=hf_gen, train_peak=train_peak,
        generation_peak=generation_peak, peak=peak, phase=phase, kv_bytes_per_token=kv_bpt, kv_tokens=kv_tokens,
        max_model_len=max_model_len, concurrent_sequences=concurrent, generation_batch=gen_batch, verdict=verdict,
        problems=problems, warnings=warnings, notes=notes, teacher_model=teacher_w, teacher_logprobs=teacher_pass,
        value_model=value_w, value_update=value_pass, explorer_model=explorer_w, explorer_generation=explorer_gen,
        logit_avg_reference=logit_ref, srpo_teacher=srpo_teacher, srpo_targets=srpo_targets,
        logit_avg_generation=logit_avg_gen, srpo_teacher_pass=srpo_pass,
    )


# ----------------------------------------------------------------------------------------------------------------
# public entry points


def _check_inputs(i: PlanInputs) -> None:
    positive_ints = ("lora_r", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "steps_per_generation", "completion_length", "num_iterations", "kv_cache_dtype_bytes")
    for name in positive_ints:
        value = getattr(i, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if not isinstance(i.prompt_length, int) or i.prompt_length < 0:
        raise ValueError(f"prompt_length must be a non-negative integer, got {i.prompt_length!r}.")
    if i.vllm_max_model_length is not None and i.vllm_max_model_length < 1:
        raise ValueError(f"vllm_max_model_length must be positive, got {i.vllm_max_model_length!r}.")
    if i.logprob_head not in LOGPROB_HEADS:
        raise ValueError(f"logprob_head={i.logprob_head!r}: use one of {LOGPROB_HEADS}.")
    if i.logps_chunk_size is not None and (isinstance(i.logps_chunk_size, bool) or i.logps_chunk_size < 1):
        raise ValueError(f"logps_chunk_size must be a positive integer or None, got {i.logps_chunk_size!r}.")
    k = i.generation_micro_group_size
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"generation_micro_group_size must be a positive integer or None, got {k!r}.")
    if k is not None and i.use_vllm:
        raise ValueError("generation_micro_group_size splits transformers generate() calls; vLLM pages its own KV "
                         "cache (use_vllm=True). Drop one of the two.")
    if i.prefix_grouper and i.gradient_checkpointing:
        raise ValueError("prefix_grouper needs gradient_checkpointing=False (transformers drops the key/value cache "
                         "inside checkpointed layers); pass --no-gradient_checkpointing or drop prefix_grouper.")
    for name in ("gpu_memory_gib", "fragmentation", "logits_copies"):
        if not getattr(i, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(i, name)!r}.")
    for name in ("cuda_context_gib", "vllm_profile_gib", "vllm_cuda_graph_gib", "vllm_nontorch_gib",
                 "vllm_sleep_residual_gib", "lora_dropout", "margin"):
        if getattr(i, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(i, name)!r}.")
    if not 0 < i.usable_fraction <= 1:
        raise ValueError(f"usable_fraction must be in (0, 1], got {i.usable_fraction!r}.")
    if i.use_vllm and not 0 < i.vllm_gpu_memory_utilization < 1:
        raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1), got {i.vllm_gpu_memory_utilization!r}.")
    if i.use_vllm and i.vllm_mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode={i.vllm_mode!r}: use one of {VLLM_MODES}.")
    if (i.per_device_train_batch_size * i.steps_per_generation) % i.num_generations:
        raise ValueError(
            f"generation batch per_device_train_batch_size × steps_per_generation = {i.per_device_train_batch_size}"
            f" × {i.steps_per_generation} is not divisible by num_generations={i.num_generations} (TRL rejects "
            f"this too): raise steps_per_generation or gradient_accumulation_steps, or change the batch size."
        )
    if i.weight_dtype not in ("nf4", "fp8"):
        _dtype_bytes(i.weight_dtype, "weight_dtype")
    _targets(i.lora_target_modules)
    if i.explorer is not None and i.use_vllm:
        raise ValueError("an S2L-PO explorer generates with transformers generate() (rollout_filter='s2l_po' refuses "
                         "vLLM): drop use_vllm or the explorer model.")
    topk = i.srpo_distill_topk
    if topk is not None and (not isinstance(topk, int) or isinstance(topk, bool) or topk < 1):
        raise ValueError(f"srpo_distill_topk must be a positive integer or None, got {topk!r}.")
    if i.srpo_teacher_kind not in SRPO_TEACHER_KINDS:
        raise ValueError(f"srpo_teacher_kind={i.srpo_teacher_kind!r}: use one of {SRPO_TEACHER_KINDS}.")


def plan_memory(
    model,
    *,
    use_peft: bool = True,
    lora_r: int = 16,
    lora_target_modules=("all-linear",),
    lora_dropout: float = 0.0,
    load_in_4bit: bool = False,
    bnb_double_quant: bool = False,
    weight_dtype: str = "bfloat16",
    bf16: bool = True,
    optim: str = "adamw_torch",
    num_generations: int = 8,
    per_device_train_batch_size: int | None = None,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int | None = None,
    prompt_length: int = 512,
    completion_length: int = 1024,
    gradient_checkpointing: bool = True,
    use_liger_kernel: bool = False,
    cast_lm_head_to_fp32: bool = False,
    logprob_head: str = "trl-fused",
    logps_chunk_size: int | None = None,
    prefix_grouper: bool = False,
    generation_micro_group_size: int | None = None,
    beta: float = 0.0,
    num_iterations: int = 1,
    use_vllm: bool = False,
    vllm_mode: str = "colocate",
    vllm_gpu_memory_utilization: float = 0.3,
    vllm_enable_sleep_mode: bool = False,
    vllm_max_model_length: int | None = None,
    vllm_importance_sampling_correction: bool = True,
    vllm_enforce_eager: bool = False,
    gpu_memory_gib: float = 40.0,
    suggest: bool = True,
    teacher_model=None,
    value_model=None,
    explorer_model=None,
    logit_avg: bool = False,
    srpo_distill_topk: int | None = None,
    srpo_teacher_kind: str = "ema",
    **constants: Any,
) -> MemoryPlan:
    """Plan the peak GPU memory of one single-GPU GRPO run.

    Args:
        model: a shipped model name (`KNOWN_MODELS`, e.g. "Qwen/Qwen2.5-1.5B"), a config.json path, a local model
            folder, an `Architecture` or a config dict.
        use_peft, lora_r, lora_target_modules, lora_dropout: LoRA settings (as in `trl.ModelConfig`;
            `lora_target_modules=None` is peft's default q_proj/v_proj). `use_peft=False` plans full fine-tuning.
        load_in_4bit, bnb_double_quant: QLoRA base in bitsandbytes NF4 (`use_bnb_nested_quant`).
        weight_dtype: dtype the policy is loaded in ("bfloat16", "float32", ...; "fp8" for an FP8 checkpoint).
        bf16: mixed precision (bf16 activations even with fp32 weights). optim: "adamw_torch", "adamw_8bit", ...
        num_generations: group size G. per_device_train_batch_size: completions per micro-batch (default: G).
        gradient_accumulation_steps, steps_per_generation: as in `GRPOConfig` (the latter defaults to the former);
            the generation batch is `per_device_train_batch_size × steps_per_generation`.
        prompt_length, completion_length: padded lengths in tokens (`max_completion_length`).
        gradient_checkpointing, cast_lm_head_to_fp32, beta, num_iterations: as in `GRPOConfig`.
        use_liger_kernel: Liger's fused RMSNorm/SwiGLU layer kernels (fewer saved activations); TRL 1.16 keeps its
            own fused LM head, so Liger's GRPO loss is `logprob_head="liger"`.
        logprob_head: "trl-fused" (TRL 1.16, default), "unfused" (full logits, older TRL), "liger".
        logps_chunk_size: trl_groupx chunked log-probs (`GRPOConfig.logps_chunk_size`), rows per LM-head chunk.
        prefix_grouper: trl_groupx shared-prefix forward (needs `gradient_checkpointing=False`): the prompt's
            activations once per distinct prompt of the micro-batch.
        generation_micro_group_size: trl_groupx micro sampling groups: transformers `generate()` on at most this
            many sequences at a time (not with vLLM).
        use_vllm, vllm_mode, vllm_gpu_memory_utilization, vllm_enable_sleep_mode, vllm_max_model_length,
            vllm_importance_sampling_correction: as in `GRPOConfig`. vllm_enforce_eager: no CUDA graphs.
        gpu_memory_gib: the card's size (40 for an A100-40GB); torch sees `usable_fraction` (0.989) of it.
        suggest: compute the settings that would make it fit (each by re-running the planner).
        teacher_model: dGRPO's teacher (`opd_teacher_model`), resolved like `model`; `None` without one.
        value_model: SPPO's value model (`sppo_value_model`), resolved like `model`; `None` without SPPO.
        explorer_model: S2L-PO's explorer (`s2l_po_explorer_model`), resolved like `model`; `None` without one.
        logit_avg: logit-averaged reference anchoring (`rollout_filter="logit_avg"`): a frozen copy of the policy
            under full fine-tuning.
        srpo_distill_topk, srpo_teacher_kind: SRPO (`loss_type="srpo"`): k of the stored teacher targets (`None`
            without SRPO) and the self-teacher's kind ("ema", "live", "base").
        **constants: calibration constants of `PlanInputs` (logits_copies, fragmentation, cuda_context_gib,
            vllm_profile_gib, vllm_cuda_graph_gib, vllm_nontorch_gib, vllm_sleep_residual_gib,
            kv_cache_dtype_bytes, usable_fraction, margin).

    Raises:
        ValueError: unknown model (naming the fix), negative or zero sizes, inconsistent batch sizes.
    """
    unknown = set(constants) - {f.name for f in dataclasses.fields(PlanInputs)}
    if unknown:
        raise TypeError(f"plan_memory() got unexpected arguments {sorted(unknown)}.")
    arch = resolve_architecture(model)
    if per_device_train_batch_size is None:
        per_device_train_batch_size = num_generations
    if steps_per_generation is None:
        steps_per_generation = gradient_accumulation_steps
    if isinstance(lora_target_modules, list):
        lora_target_modules = tuple(lora_target_modules)
    inputs = PlanInputs(
        arch=arch, use_peft=use_peft, lora_r=lora_r, lora_target_modules=lora_target_modules,
        lora_dropout=lora_dropout, load_in_4bit=load_in_4bit, bnb_double_quant=bnb_double_quant,
        weight_dtype=weight_dtype, bf16=bf16, optim=optim, num_generations=num_generations,
        per_device_train_batch_size=per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps, steps_per_generation=steps_per_generation,
        prompt_length=prompt_length, completion_length=completion_length,
        gradient_checkpointing=gradient_checkpointing, use_liger_kernel=use_liger_kernel,
        cast_lm_head_to_fp32=cast_lm_head_to_fp32, logprob_head=logprob_head, logps_chunk_size=logps_chunk_size,
        prefix_grouper=prefix_grouper, generation_micro_group_size=generation_micro_group_size, beta=beta, num_iterations=num_iterations, use_vllm=use_vllm, vllm_mode=vllm_mode,
        vllm_gpu_memory_utilization=vllm_gpu_memory_utilization, vllm_enable_sleep_mode=vllm_enable_sleep_mode,
        vllm_max_model_length=vllm_max_model_length,
        vllm_importance_sampling_correction=vllm_importance_sampling_correction,
        vllm_enforce_eager=vllm_enforce_eager, gpu_memory_gib=gpu_memory_gib,
        teacher=None if teacher_model is None else resolve_architecture(teacher_model),
        value_model=None if value_model is None else resolve_architecture(value_model),
        explorer=None if explorer_model is None else resolve_architecture(explorer_model), logit_avg=logit_avg,
        srpo_distill_topk=srpo_distill_topk, srpo_teacher_kind=srpo_teacher_kind, **constants,
    )
    return plan_inputs(inputs, suggest=suggest)


def plan_inputs(inputs: PlanInputs, *, suggest: bool = True) -> MemoryPlan:
    """The plan for a `PlanInputs` (validated); with `suggest`, also the settings that would make it fit."""
    _check_inputs(inputs)
    plan = _compute(inputs)
    if suggest:
        plan.suggestions = suggest_fixes(inputs, plan)
    return plan


def plan_from_config(grpo_config, model_args=None, *, model=None, prompt_length: int | None = None,
                     gpu_memory_gib: float = 40.0, suggest: bool = True, **constants: Any) -> MemoryPlan:
    """Plan a run from the same `trl_groupx.GRPOConfig` (+ `trl.ModelConfig`) a recipe builds.

    `model` overrides `model_args.model_name_or_path` (e.g. a local folder). TRL 1.16 has no `max_prompt_length`:
    the prompt length is `prompt_length`, else `vllm_max_model_length - max_completion_length` when that is set,
    else 512 (said so in the plan's notes). `logps_chunk_size` (chunked log-probs), `prefix_grouper` and
    `generation_micro_group_size` are read when the config has them, and so are the extra models and buffers of
    SPPO (`advantage_estimator="sppo"`: `sppo_value_model`), S2L-PO (`rollout_filter="s2l_po"` with
    `s2l_po_anneal_steps > 0`: `s2l_po_explorer_model`), logit averaging (`rollout_filter="logit_avg"`) and SRPO
    (`loss_type="srpo"`: `srpo_distill_topk`, `srpo_teacher_kind`).
    """
    c, m = grpo_config, model_args
    model = model or (m.model_name_or_path if m is not None else None)
    if model is None:
        raise ValueError("plan_from_config: no model; pass model_args with model_name_or_path, or model=...")
    notes = []
    if prompt_length is None:
        if c.vllm_max_model_length:
            prompt_length = max(c.vllm_max_model_length - c.max_completion_length, 0)
        else:
            prompt_length = 512
            notes.append("prompt length assumed 512 tokens (TRL has no max_prompt_length; pass --plan_prompt_length).")
    dtype = "bfloat16"
    if m is not None and m.dtype not in (None, "auto"):
        dtype = m.dtype
    init_kwargs = getattr(c, "model_init_kwargs", None) or {}
    rollout_filter = getattr(c, "rollout_filter", None)
    if init_kwargs.get("dtype") not in (None, "auto"):
        dtype = str(init_kwargs["dtype"]).replace("torch.", "")
    plan = plan_memory(
        model,
        use_peft=bool(m.use_peft) if m is not None else False,
        lora_r=m.lora_r if m is not None else 16,
        lora_target_modules=m.lora_target_modules if m is not None else None,
        lora_dropout=m.lora_dropout if m is not None else 0.0,
        load_in_4bit=bool(m.load_in_4bit) if m is not None else False,
        bnb_double_quant=bool(m.use_bnb_nested_quant) if m is not None else False,
        weight_dtype=dtype,
        bf16=bool(c.bf16),
        optim=str(getattr(c.optim, "value", c.optim)),
        num_generations=c.num_generations,
        per_device_train_batch_size=c.per_device_train_batch_size,
        gradient_accumulation_steps=c.gradient_accumulation_steps,
        steps_per_generation=c.steps_per_generation,
        prompt_length=prompt_length,
        completion_length=c.max_completion_length,
        gradient_checkpointing=bool(c.gradient_checkpointing),
        use_liger_kernel=bool(c.use_liger_kernel),
        cast_lm_head_to_fp32=bool(getattr(c, "cast_lm_head_to_fp32", False)),
        logps_chunk_size=getattr(c, "logps_chunk_size", None),
        prefix_grouper=bool(getattr(c, "prefix_grouper", False)),
        generation_micro_group_size=getattr(c, "generation_micro_group_size", None),
        beta=c.beta,
        num_iterations=c.num_iterations,
        use_vllm=bool(c.use_vllm),
        vllm_mode=c.vllm_mode,
        vllm_gpu_memory_utilization=c.vllm_gpu_memory_utilization,
        vllm_enable_sleep_mode=bool(c.vllm_enable_sleep_mode),
        vllm_max_model_length=c.vllm_max_model_length,
        vllm_importance_sampling_correction=bool(c.vllm_importance_sampling_correction),
        gpu_memory_gib=gpu_memory_gib,
        suggest=suggest,
        # dGRPO: the teacher is loaded only when its coefficient is non-zero (trl_groupx/objective/dgrpo.py); RTO's
        # frozen DPO model (trl_groupx/token_weights/rto.py) is loaded and run the same way
        teacher_model=(getattr(c, "opd_teacher_model", None) if getattr(c, "opd_coef", 0) else None)
        or (getattr(c, "rto_dpo_model", None) if getattr(c, "token_weighting", None) == "rto" else None),
        # the models the trainer builds for these variants, under the conditions it builds them on
        value_model=getattr(c, "sppo_value_model", None) if getattr(c, "advantage_estimator", None) == "sppo" else None,
        explorer_model=getattr(c, "s2l_po_explorer_model", None)
        if rollout_filter == "s2l_po" and getattr(c, "s2l_po_anneal_steps", 0) else None,
        logit_avg=rollout_filter == "logit_avg",
        srpo_distill_topk=getattr(c, "srpo_distill_topk", None) if c.loss_type == "srpo" else None,
        srpo_teacher_kind=getattr(c, "srpo_teacher_kind", "ema") if c.loss_type == "srpo" else "ema",
        **constants,
    )
    plan.notes[:0] = notes
    return plan


# ----------------------------------------------------------------------------------------------------------------
# suggestions: every one is a re-run of the planner with the changed setting


def _rerun(inputs: PlanInputs, **changes) -> MemoryPlan:
    return _compute(dataclasses.replace(inputs, **changes))


def _suggestion(description: str, inputs: PlanInputs, changes: dict[str, Any], detail: str = "") -> Suggestion:
    p = _rerun(inputs, **changes)
    if not detail and p.problems:
        detail = p.problems[0]
    return Suggestion(description, changes, p.peak, p.verdict, detail)


def largest_vllm_utilization(inputs: PlanInputs, *, step: float = 0.01) -> tuple[float, MemoryPlan] | None:
    """The largest `vllm_gpu_memory_utilization` (multiple of `step`) whose plan fits, and that plan."""
    n = round(0.95 / step)
    for k in range(n, 0, -1):
        u = round(k * step, 6)
        p = _rerun(inputs, vllm_gpu_memory_utilization=u)
        if p.verdict == "fits":
            return u, p
    return None


def _smaller_batches(inputs: PlanInputs) -> list[dict[str, Any]]:
    """Smaller micro-batches that keep the generation batch and the optimizer batch (more accumulation)."""
    b = inputs.per_device_train_batch_size
    out = []
    for nb in range(b - 1, 0, -1):
        if b % nb:
            continue
        f = b // nb
        out.append({"per_device_train_batch_size": nb,
                    "gradient_accumulation_steps": inputs.gradient_accumulation_steps * f,
                    "steps_per_generation": inputs.steps_per_generation * f})
    return out


def _single_changes(inputs: PlanInputs, plan: MemoryPlan) -> list[tuple[str, dict[str, Any]]]:
    i = inputs
    out: list[tuple[str, dict[str, Any]]] = []
    colocate = i.use_vllm and i.vllm_mode == "colocate"
    if colocate and not i.vllm_enable_sleep_mode:
        out.append(("vllm_enable_sleep_mode=True", {"vllm_enable_sleep_mode": True}))
    if i.use_peft and not i.load_in_4bit:
        out.append(("load_in_4bit=True (QLoRA)", {"load_in_4bit": True}))
    if not i.use_peft:
        out.append(("use_peft=True (LoRA r=16, all-linear)", {"use_peft": True, "lora_r": 16,
                                                               "lora_target_modules": ("all-linear",)}))
    if not i.gradient_checkpointing:
        if i.prefix_grouper:
            out.append(("gradient_checkpointing=True (drops prefix_grouper, which needs it off)",
                        {"gradient_checkpointing": True, "prefix_grouper": False}))
        else:
            out.append(("gradient_checkpointing=True", {"gradient_checkpointing": True}))
    if not i.prefix_grouper and i.num_generations > 1:
        desc = "prefix_grouper=True (each prompt encoded once per group)"
        if i.gradient_checkpointing:
            desc += " + gradient_checkpointing=False (prefix_grouper needs it off)"
        out.append((desc, {"prefix_grouper": True, "gradient_checkpointing": False}))
    micro = _micro_group_change(i)
    if micro is not None:
        out.append(micro)
    if not i.logps_chunk_size:
        out.append(("logps_chunk_size=128 (chunked log-probs)", {"logps_chunk_size": 128}))
    if not i.use_liger_kernel:
        out.append(("use_liger_kernel=True", {"use_liger_kernel": True}))
    return out


def _micro_group_change(i: PlanInputs) -> tuple[str, dict[str, Any]] | None:
    """Micro sampling groups for transformers `generate()`: the fewest `generate()` calls c whose balanced chunk
    size k = ceil(n / c) fits (for c calls no k has a lower peak), else k = 1 (the least generation memory); None
    with vLLM or nothing to split. `n` is the current number of sequences per call."""
    if i.use_vllm:
        return None
    current = generation_sequences(i)
    if current <= 1:
        return None
    sizes = dict.fromkeys(-(-current // calls) for calls in range(2, current + 1))  # ceil, largest first, unique
    k = next((k for k in sizes if _rerun(i, generation_micro_group_size=k).verdict == "fits"), 1)
    return (f"generation_micro_group_size={k} (generate() {k} of {current} sequences at a time)",
            {"generation_micro_group_size": k})


def suggest_fixes(inputs: PlanInputs, plan: MemoryPlan | None = None) -> list[Suggestion]:
    """Settings that would make the run fit (or use the GPU better), each computed by re-running the planner.

    With colocated vLLM every suggestion comes at the largest `vllm_gpu_memory_utilization` that then fits; when
    `vllm_max_model_length` is unset and the model's context is longer than prompt + completion, every suggestion
    also sets it (otherwise vLLM reserves room for one full-context sequence).
    """
    plan = plan or _compute(inputs)
    out: list[Suggestion] = []
    colocate = inputs.use_vllm and inputs.vllm_mode == "colocate"
    base: dict[str, Any] = {}
    t = inputs.prompt_length + inputs.completion_length
    if colocate and inputs.vllm_max_model_length is None and (plan.max_model_len or 0) > t:
        base = {"vllm_max_model_length": t}
    i = dataclasses.replace(inputs, **base)
    suffix = f" (+ vllm_max_model_length={t})" if base else ""

    def make(desc: str, changes: dict[str, Any]) -> Suggestion:
        changes = {**base, **changes}
        if not colocate:
            return _suggestion(desc, inputs, changes)
        best = largest_vllm_utilization(dataclasses.replace(inputs, **changes))
        if best is None:
            return _suggestion(desc + suffix, inputs, changes)
        u, p = best
        changes = {**changes, "vllm_gpu_memory_utilization": u}
        detail = (f"vLLM KV cache {gib(p.vllm_kv_cache):.1f} GiB = {p.concurrent_sequences} full-length sequences "
                  f"(generation batch {p.generation_batch})")
        return Suggestion(f"{desc}{suffix}, vllm_gpu_memory_utilization={u:g}", changes, p.peak, p.verdict, detail)

    if colocate:
        s = make("largest vllm_gpu_memory_utilization that fits", {})
        if "vllm_gpu_memory_utilization" not in s.changes:
            s.description = "no vllm_gpu_memory_utilization fits with the other settings unchanged" + suffix
        out.append(s)
    if plan.fits:
        return out

    singles = _single_changes(i, plan)
    for desc, changes in singles:
        s = make(desc, changes)
        if s.fits or s.peak < plan.peak or (plan.problems and s.verdict != "does not fit"):
            out.append(s)  # a change that neither fits nor lowers the peak is not worth listing

    batches = _smaller_batches(i)
    for changes in batches:
        s = make(_batch_desc(changes), changes)
        if s.fits or changes is batches[-1]:
            out.append(s)
            break

    if not any(s.fits for s in out):
        combo = _greedy_combination(i, singles + [(_batch_desc(c), c) for c in batches])
        if combo is not None:
            combo.changes = {**base, **combo.changes}
            combo.description += suffix
            out.append(combo)
    return out


def _batch_desc(changes: dict[str, Any]) -> str:
    return (f"per_device_train_batch_size={changes['per_device_train_batch_size']}, gradient_accumulation_steps="
            f"{changes['gradient_accumulation_steps']}, steps_per_generation={changes['steps_per_generation']} "
            f"(same generation and optimizer batch)")


def _greedy_combination(inputs: PlanInputs, options: list[tuple[str, dict[str, Any]]]) -> Suggestion | None:
    """Apply, one at a time, the change that lowers the peak most, until the plan fits (at most 4 changes)."""
    colocate = inputs.use_vllm and inputs.vllm_mode == "colocate"
    current, chosen, changes = inputs, [], {}
    remaining = list(options)
    for _ in range(4):
        scored = []
        for desc, ch in remaining:
            if any(k in changes for k in ch if k not in ("gradient_accumulation_steps", "steps_per_generation")):
                continue
            trial = dataclasses.replace(current, **ch)
            if colocate:
                best = largest_vllm_utilization(trial)
                p = best[1] if best else _compute(trial)
                ch = {**ch, "vllm_gpu_memory_utilization": best[0]} if best else ch
            else:
                p = _compute(trial)
            score = (p.verdict == "fits", -p.peak if p.verdict != "fits" else 0, -len(ch))
            scored.append((score, desc, ch, p))
        if not scored:
            return None
        scored.sort(key=lambda x: x[0], reverse=True)
        _, desc, ch, p = scored[0]
        chosen.append(desc)
        changes.update(ch)
        current = dataclasses.replace(current, **ch)
        remaining = [(d, c) for d, c in remaining if d != desc]
        if p.verdict == "fits":
            u = changes.get("vllm_gpu_memory_utilization")
            desc = "combined: " + " + ".join(chosen) + (f", vllm_gpu_memory_utilization={u:g}" if u else "")
            return Suggestion(desc, changes, p.peak, p.verdict)
    p = _compute(current)
    return Suggestion("combined: " + " + ".join(chosen), changes, p.peak, p.verdict,
                      "still does not fit: shorten max_completion_length or use a smaller model / bigger GPU")


# ----------------------------------------------------------------------------------------------------------------
# report


def _setting_line(i: PlanInputs) -> str:
    if i.use_peft:
        mode = f"{'QLoRA (NF4' + (', double quant' if i.bnb_double_quant else '') + ')' if i.load_in_4bit else 'LoRA'}"
        targets = ",".join(_targets(i.lora_target_modules))
        targets = "all-linear" if set(_targets(i.lora_target_modules)) == set(ALL_LINEAR) else targets
        mode += f" r={i.lora_r} on {targets}, {i.weight_dtype} base"
    else:
        mode = f"full fine-tuning in {i.weight_dtype}"
    if i.use_vllm:
        gen = f"vLLM {i.vllm_mode}"
        if i.vllm_mode == "colocate":
            gen += f", gpu_memory_utilization={i.vllm_gpu_memory_utilization:g}"
            gen += ", sleep mode" if i.vllm_enable_sleep_mode else ""
    else:
        gen = "transformers generate()"
        if i.generation_micro_group_size is not None:
            gen += f" on {generation_sequences(i)} sequences at a time (generation_micro_group_size)"
    return (f"{mode}; G={i.num_generations}, B={i.per_device_train_batch_size} (x{i.gradient_accumulation_steps} "
            f"accumulation, generation batch {i.per_device_train_batch_size * i.steps_per_generation}), prompt "
            f"{i.prompt_length} + completion {i.completion_length} tokens; gradient checkpointing "
            f"{'on' if i.gradient_checkpointing else 'off'}{', Liger' if i.use_liger_kernel else ''}"
            f"{f', logps_chunk_size={i.logps_chunk_size}' if i.logps_chunk_size else ''}"
            f"{', prefix_grouper' if i.prefix_grouper else ''}; log-prob head "
            f"{i.logprob_head}; {gen}")


def format_report(plan: MemoryPlan) -> str:
    i, a = plan.inputs, plan.inputs.arch
    lines = [
        (f"Memory plan: {a.name} ({a.num_params / 1e9:.2f}B params, vocab {a.vocab_size:,}) on a "
         f"{i.gpu_memory_gib:g} GiB GPU ({gib(plan.usable_bytes):.2f} GiB usable)"),
        f"  {_setting_line(i)}",
        "",
        f"  {'term':<46}{'GiB':>9}",
        f"  {'-' * 55}",
    ]
    for name, value in plan.breakdown():
        lines.append(f"  {name:<46}{gib(value):>9.2f}")
    lines.append(f"  {'-' * 55}")
    lines.append(f"  {'training-step peak':<46}{gib(plan.train_peak):>9.2f}")
    if plan.generation_peak:
        lines.append(f"  {'generation peak':<46}{gib(plan.generation_peak):>9.2f}")
    lines.append(f"  {'PEAK (' + plan.phase + ')':<46}{gib(plan.peak):>9.2f}")
    lines.append("")
    head = plan.headroom
    if plan.verdict == "does not fit":
        verdict = f"VERDICT: does not fit ({gib(-head):.2f} GiB over)" if head < 0 else "VERDICT: does not fit"
    elif plan.verdict == "tight":
        verdict = (f"VERDICT: tight: fits with {gib(head):.2f} GiB headroom, under the {i.margin:.0%} safety margin "
                   f"(the model is ±10-15%)")
    else:
        verdict = f"VERDICT: fits, {gib(head):.2f} GiB headroom ({head / plan.usable_bytes:.0%})"
    lines.append(verdict)
    for p in plan.problems:
        lines.append(f"  ! {p}")
    for w in plan.warnings:
        lines.append(f"  warning: {w}")
    if plan.kv_tokens:
        lines.append(f"  vLLM KV cache: {plan.kv_tokens:,} tokens ({plan.kv_bytes_per_token // 1024} KiB/token), "
                     f"{plan.concurrent_sequences} full-length sequences; generation batch {plan.generation_batch}")
    for n in plan.notes:
        lines.append(f"  note: {n}")
    if plan.suggestions:
        lines.append("")
        lines.append("Settings (each re-planned):")
        for s in plan.suggestions:
            mark = {"fits": "fits", "tight": "tight", "does not fit": "no"}[s.verdict]
            lines.append(f"  [{mark:>5}] {s.description}: peak {gib(s.peak):.2f} GiB")
            if s.detail:
                lines.append(f"          {s.detail}")
    return "\n".join(lines)
