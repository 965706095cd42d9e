"""Peak memory of one generation call with `generation_micro_group_size=k`, as a ratio against plain TRL 1.16.

    python benchmarks/micro_groups.py                     # writes benchmarks/results/micro_groups.md
    python benchmarks/micro_groups.py --rows 8 --prompt-len 16 --completion-len 4 --sizes 2 --in-process \
        --output /tmp/x.md                                # smoke

A random Llama (hidden 512, 4 layers, 8 heads, vocab 32,000, float32) is built here, and one call of
`trl_groupx.GRPOTrainer._generate_single_turn` (TRL's transformers `generate()` path, greedy) runs on `--rows`
sequences: `--rows / 16` prompts of `--prompt-len` random tokens, each repeated 16 times as TRL's sampler does.
`min_new_tokens = max_completion_length` keeps every sequence decoding to `--completion-len` tokens, the length the
key/value cache must be sized for. Every case runs in its own fresh process, with glibc's malloc pinned to return
large blocks to the OS (`MALLOC_MMAP_THRESHOLD_`), after one warm-up call on the same rows; the number reported is
the peak resident set during the measured call (VmHWM, reset through /proc/self/clear_refs) minus the resident set
just before it: what generation adds on top of the loaded model (key/value cache, prefill activations, per-step
logits and sampling buffers, allocator slack). Cases:

- `trl`: no flag, one `generate()` on all rows.
- `k=N`: `generation_micro_group_size=N`, ceil(rows / N) consecutive `generate()` calls.

CPU numbers only: on a GPU the same terms scale the same way, but the allocator caches blocks (memory is reused,
not returned), so read `torch.cuda.max_memory_allocated` there; this script does not measure a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._isolated import reset_peak, run_case, status_kib  # noqa: E402

for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_key, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
GROUP = 16  # completions per prompt (num_generations)


def _kv_cache_mib(rows: int, args: argparse.Namespace) -> float:
    """fp32 key/value cache of `rows` sequences at full length: rows · T · 2 (K, V) · layers · hidden · 4 bytes."""
    return rows * (args.prompt_len + args.completion_len) * 2 * args.layers * args.hidden * 4 / 2**20


def _measure(case: str, args: argparse.Namespace) -> dict:
    """Runs in the child process: build, warm up, measure one generation call."""
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    import trl_groupx
    from trl_groupx.toy import arithmetic_dataset, load_tiny_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=args.prompt_len + args.completion_len,
        pad_token_id=0, eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    k = int(case.split("=")[1]) if case.startswith("k=") else None
    grpo_args = trl_groupx.GRPOConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
        num_generations=GROUP, per_device_train_batch_size=args.rows, max_completion_length=args.completion_len,
        generation_kwargs={"do_sample": False, "min_new_tokens": args.completion_len},
        generation_micro_group_size=k, disable_tqdm=True, save_strategy="no",
    )
    trainer = trl_groupx.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=grpo_args,
        train_dataset=arithmetic_dataset(8, seed=0), processing_class=load_tiny_tokenizer(),
    )
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, args.vocab, (max(args.rows // GROUP, 1), args.prompt_len), generator=gen).tolist()
    prompt_ids = [prompts[r // GROUP % len(prompts)] for r in range(args.rows)]

    def call():
        completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, GROUP)
        return completions

    call()  # warm-up: lazy allocations, oneDNN primitives
    before = reset_peak()  # VmHWM reset to the current resident set
    start = time.perf_counter()
    completions = call()
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    return {"case": case, "peak_mib": (peak - before) / 1024, "seconds": seconds,
            "tokens": sum(len(c) for c in completions), "completions": completions}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", type=int, default=64, help="sequences per generation call (prompts × 16)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 16, 4])
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "micro_groups.md"))
    p.add_argument("--in-process", action="store_true", help="no subprocesses (smoke tests; numbers not isolated)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.child, args)))
        return []
    shared = [a for a in argv if a != "--in-process"]
    cases = ["trl", *[f"k={k}" for k in args.sizes]]
    rows = [_measure(case, args) if args.in_process else run_case(__file__, case, shared) for case in cases]
    same = all(r["completions"] == rows[0]["completions"] for r in rows)
    base = max(rows[0]["peak_mib"], 1e-9)  # at smoke-test sizes the call may not raise the high-water mark at all
    lines = [
        "# Micro sampling groups: peak memory of one generation call (CPU)",
        "",
        f"`python benchmarks/micro_groups.py {' '.join(argv)}`".replace(" `", "`"),
        "",
        (
            f"Random Llama, vocab {args.vocab:,}, hidden {args.hidden}, {args.layers} layers, float32; one call of "
            f"TRL's transformers generation path on {args.rows} sequences ({max(args.rows // GROUP, 1)} prompts × "
            f"{GROUP}), {args.prompt_len} prompt + {args.completion_len} completion tokens each (greedy, "
            "`min_new_tokens` so that every sequence runs to full length). Peak = resident-set high-water mark during "
            "the call minus the resident set before it, one fresh process per case after a warm-up call. KV cache "
            "column: the fp32 key/value cache of the sequences of one `generate()` call at full length, for scale."
        ),
        "",
        "| case | sequences per generate() | KV cache (MiB) | peak over baseline (MiB) | ratio vs plain TRL | "
        "call time (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per_call = args.rows if r["case"] == "trl" else min(int(r["case"][2:]), args.rows)
        lines.append(
            f"| {r['case']} | {per_call} | {_kv_cache_mib(per_call, args):,.0f} | {r['peak_mib']:,.0f} | "
            f"{r['peak_mib'] / base:.2f} | {r['seconds']:.2f} |"
        )
    lines += [
        "",
        f"Completions identical to plain TRL in every case (greedy): {'yes' if same else 'NO'}.",
        (
            "`trl` is TRL 1.16's single `generate()` call (no flag); `k=N` is `generation_micro_group_size=N`. The "
            "peak also holds what does not scale with k: the reassembled completion lists and allocator slack."
        ),
        (
            "Call times are wall-clock on a shared 2-core machine while other jobs ran: not a speed comparison "
            "(smaller k means more sequential decode steps; on a GPU a small k also leaves the device underused)."
        ),
    ]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
