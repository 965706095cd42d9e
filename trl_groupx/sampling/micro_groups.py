"""Micro sampling groups (`generation_micro_group_size=k`): one generation call runs as consecutive `generate()`
calls of at most k sequences, reassembled in the original row order.

Infinite Sampling (catalog id `infinite_sampling`, stage `efficiency`; /work/shared/catalog.md, abstract in
`seeds/004_65d2611f32946cb1.txt` ¶64) decouples the group size from the memory of sampling: a group of G
completions is generated as several micro sampling groups, so the decode-time key/value cache and logits hold k
sequences instead of G (× prompts per device). This module implements that first component only, on TRL 1.16's
transformers `generate()` path. The paper's other two components, continuous interleaved sampling (refilling a
finished slot with the next sequence) and the length-aware scheduler (FPTAS grouping + shortest-job-first refill),
are throughput optimisations on top of micro sampling and are not implemented: the chunks here run one after the
other, in row order. No official code is listed for the paper (/work/shared/official-code.md), so nothing is
ported; the slicing and reassembly below are ours.

What a chunk is. TRL's transformers path (`trl.GRPOTrainer._generate_single_turn`, trl 1.16
`trl/trainer/grpo_trainer.py` lines 1763-1891) receives one row per sequence to generate (the sampler already
repeats each prompt G times) and returns one completion per row. Here rows `[s, s + k)` are passed to TRL's own
method, unchanged, for s = 0, k, 2k, ...; the completion lists are concatenated. The last chunk is shorter when k
does not divide the number of rows. Per chunk we slice `prompt_ids`, `images` (one entry per row) and the
multimodal fields: image tensors flattened over patches (Qwen-VL's `pixel_values` + `image_grid_thw`, ...) are first
split per row with TRL's own `split_pixel_values_by_grid` and merged back with `unsplit_pixel_values_by_grid`, as
TRL's tool loop does; every other field must have one entry per row (else a `ValueError` names it). Each chunk is
left-padded to its own longest prompt, which `generate()` handles through the attention mask and the position ids
it derives from it.

Guarantee. With greedy decoding (`generation_kwargs={"do_sample": False}`) the completions equal those of one
unchunked call, row by row (tested on the shipped tiny Llama for several k, k not dividing the batch, k = 1). This
rests on the model's rows being independent given their own left padding; a float rounding difference between
batch shapes could in principle flip a near-tie of the argmax on other kernels. With sampling the completions are
draws from the same distribution, but not the same draws: `generate()` samples each step from one generator stream
in batch-shaped calls, so a chunk consumes random numbers in a different order than the full batch. Equal samples
would need one random stream per row, which `generate()` does not have. The catalog's "seeded micro-group
generation returns the same completions as full-group" therefore holds here for greedy decoding only.

Memory. Decode-time memory (key/value cache, per-step logits, prefill activations) scales with k instead of the
per-device generation batch; `benchmarks/micro_groups.py` measures it (`benchmarks/results/micro_groups.md`) and
`trl-groupx plan --generation_micro_group_size k` models it (`trl_groupx/memory/planner.py`). Cost: ceil(rows/k)
sequential `generate()` calls, each decoding until its own longest completion, so wall-clock time grows as k
shrinks.

Where it applies. Only the transformers `generate()` path. Refused at config time: `use_vllm=True` (vLLM already
pages its key/value cache and schedules as many sequences as `vllm_gpu_memory_utilization` allows; lower that, or
TRL's `vllm_max_num_seqs` where available, to bound it) and `use_transformers_continuous_batching=True` (the same:
a paged cache with its own scheduler). Refused at the first generation: DeepSpeed/FSDP together with tools or
environments, because each chunk gathers the sharded weights collectively and, in TRL's tool loop, processes can
have different numbers of rows, hence of chunks. Not exercised: DeepSpeed/FSDP without tools, real vision-language
models (the multimodal slicing is unit-tested on synthetic fields only), GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

FLAG = "generation_micro_group_size"


def validate(config: Any) -> None:
    """Config-time checks of `generation_micro_group_size` (called by `SamplingArgs.__post_init__`)."""
    k = getattr(config, FLAG, None)
    if k is None:
        return
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(
            f"{FLAG}={k!r} must be a positive integer (sequences per generate() call) or None (off); "
            f"e.g. {FLAG}=num_generations generates one group at a time."
        )
    if getattr(config, "use_vllm", False):
        raise ValueError(
            f"{FLAG} splits transformers' generate() calls; with use_vllm=True vLLM already pages its key/value cache "
            "and runs only as many sequences as fit in vllm_gpu_memory_utilization, so the flag would do nothing. "
            f"Unset {FLAG} (lower vllm_gpu_memory_utilization to bound vLLM's memory) or set use_vllm=False."
        )
    if getattr(config, "use_transformers_continuous_batching", False):
        raise ValueError(
            f"{FLAG} splits transformers' generate() calls; use_transformers_continuous_batching=True uses a paged "
            f"cache with its own scheduler instead. Unset {FLAG} or use_transformers_continuous_batching."
        )


def chunk_bounds(n_rows: int, k: int) -> list[tuple[int, int]]:
    """`[(start, stop), ...]` of the consecutive chunks of at most k rows covering `range(n_rows)`."""
    return [(s, min(s + k, n_rows)) for s in range(0, n_rows, k)]


def _split_multimodal(fields: dict[str, Any], images: Sequence | None, n_rows: int) -> tuple[dict[str, Any], bool]:
    """Fields with one entry per row (image tensors split per row with TRL's helper); `True` if `num_images` was
    added here (it is dropped again from every chunk, as TRL's tool loop does)."""
    from trl.trainer.utils import split_pixel_values_by_grid

    added = "num_images" not in fields and images is not None
    if added:
        fields = {**fields, "num_images": [len(imgs) if imgs else 0 for imgs in images]}
    split = split_pixel_values_by_grid(fields)
    for name, value in split.items():
        if len(value) != n_rows:
            raise ValueError(
                f"{FLAG}: the multimodal field {name!r} has {len(value)} entries for {n_rows} prompts and cannot be "
                f"split per prompt; unset {FLAG} for this model."
            )
    return split, added


def _select(split: dict[str, Any], start: int, stop: int, drop_num_images: bool) -> dict[str, Any]:
    from trl.trainer.utils import unsplit_pixel_values_by_grid

    out = {name: value[start:stop] for name, value in split.items()}  # tensors and lists alike
    out = unsplit_pixel_values_by_grid(out)
    if drop_num_images:
        out.pop("num_images", None)
    return out


def generate_in_micro_groups(
    trainer: Any,
    generate: Callable[..., tuple[list, list | None]],
    prompt_ids: list[list[int]],
    images: list | None,
    multimodal_fields: dict[str, Any],
    num_generations: int,
    has_tool_images: bool = False,
) -> tuple[list[list[int]], list | None]:
    """TRL's `_generate_single_turn` (`generate`, bound to the trainer) on consecutive chunks of at most
    `trainer.args.generation_micro_group_size` rows; returns `(completion_ids, logprobs)` in the original row order,
    as one call would. One chunk (rows ≤ k) is the plain call."""
    k = trainer.args.generation_micro_group_size
    n_rows = len(prompt_ids)
    if n_rows <= k:
        return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
    _check_sharded_tool_loop(trainer)
    split, added = _split_multimodal(multimodal_fields, images, n_rows) if multimodal_fields else ({}, False)
    completions: list[list[int]] = []
    logprobs: list | None = []
    for start, stop in chunk_bounds(n_rows, k):
        fields = _select(split, start, stop, added) if split else {}
        chunk_images = images[start:stop] if images is not None else None
        ids, lps = generate(prompt_ids[start:stop], chunk_images, fields, num_generations, has_tool_images)
        if len(ids) != stop - start:
            raise RuntimeError(f"{FLAG}: a chunk of {stop - start} prompts returned {len(ids)} completions.")
        completions.extend(ids)
        logprobs = None if lps is None or logprobs is None else [*logprobs, *lps]
    return completions, logprobs


def _check_sharded_tool_loop(trainer: Any) -> None:
    from accelerate.utils import DistributedType

    sharded = trainer.accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
    tools = bool(getattr(trainer, "tools", None)) or getattr(trainer, "environment_factories", None) is not None
    if sharded and tools:
        raise ValueError(
            f"{FLAG} with DeepSpeed/FSDP and tools: every chunk gathers the sharded weights collectively, and in the "
            "tool loop processes can hold different numbers of rows (so of chunks), which would hang. Unset "
            f"{FLAG} or train without tools/environments."
        )

