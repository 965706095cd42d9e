"""Peak memory of one GRPO loss step (forward + backward) with `logps_chunk_size`, as a ratio against plain TRL 1.16.

    python benchmarks/chunked_logps.py                      # writes benchmarks/results/chunked_logps.md
    python benchmarks/chunked_logps.py --vocab 8000 --completion-len 16 --chunks 8 --output /tmp/x.md   # smoke

A large-vocabulary tiny Llama (vocab 151,936 like Qwen2.5, hidden 64, 2 layers, untied head, float32) is built here,
and one loss step of `trl_groupx.GRPOTrainer` (TRL's `dapo` loss, full fine-tuning) runs on a synthetic batch of
`--batch` completions (`--prompt-len` + `--completion-len` tokens, some right-padding). Every case runs in its own
fresh process, with glibc's malloc pinned to return large blocks to the OS (`MALLOC_MMAP_THRESHOLD_`), after one
warm-up step on the same batch; the number reported is the peak resident set during the measured step (VmHWM, reset
through /proc/self/clear_refs) minus the resident set just before it. Cases:

- `trl`: no flag, TRL 1.16's fused LM head (`trl.trainer.utils.add_fused_lm_head`): 4096-token × 32768-vocab tiles
  with an online log-sum-exp; on CPU (no Triton) its torch fallback scores every position, prompt included.
- `chunk=N`: `logps_chunk_size=N`.
- `full logits`: reference only — the head as the memory facts file models it (`model(...).logits` on the
  completion positions, then `log_softmax`), i.e. what TRL did before the fused head.

CPU numbers only. On CUDA, TRL's Triton kernel works in place on one bf16 tile (~256 MiB) and skips the prompt, so
the ratio there is expected to be closer to 1 than on CPU; this script does not measure a GPU.
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


def _measure(case: str, args: argparse.Namespace) -> dict:
    """Runs in the child process: build, warm up, measure one loss step."""
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    import trl_groupx
    from trl_groupx.toy import arithmetic_dataset, load_tiny_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=args.prompt_len + args.completion_len,
        tie_word_embeddings=False, pad_token_id=0, eos_token_id=2,
    )
    model = LlamaForCausalLM(config)
    chunk = int(case.split("=")[1]) if case.startswith("chunk=") else None
    grpo_args = trl_groupx.GRPOConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
        num_generations=4, per_device_train_batch_size=args.batch, max_completion_length=args.completion_len,
        logps_chunk_size=chunk, disable_tqdm=True, save_strategy="no",
    )
    trainer = trl_groupx.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=grpo_args,
        train_dataset=arithmetic_dataset(8, seed=0), processing_class=load_tiny_tokenizer(),
    )
    if case == "full logits":
        trainer._get_per_token_logps_and_entropies = _full_logits_head(trainer)

    gen = torch.Generator().manual_seed(0)
    b, tp, tc = args.batch, args.prompt_len, args.completion_len
    lengths = torch.randint(tc // 2, tc + 1, (b,), generator=gen)
    completion_mask = (torch.arange(tc)[None, :] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": torch.randint(3, args.vocab, (b, tp), generator=gen),
        "prompt_mask": torch.ones(b, tp, dtype=torch.long),
        "completion_ids": torch.randint(3, args.vocab, (b, tc), generator=gen) * completion_mask,
        "completion_mask": completion_mask,
        "advantages": torch.randn(b, generator=gen),
        "num_items_in_batch": completion_mask.sum(),
    }
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1

    def step():
        model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        return loss.item()

    step()  # warm-up: lazy allocations, oneDNN primitives
    model.zero_grad(set_to_none=True)

    before = reset_peak()  # VmHWM reset to the current resident set
    start = time.perf_counter()
    loss = step()
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    return {"case": case, "peak_mib": (peak - before) / 1024, "seconds": seconds, "loss": loss}


def _full_logits_head(trainer):
    """The pre-fused-head computation: full logits of the completion positions, then log_softmax (reference)."""
    import torch

    def head(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **_):
        batch_size = batch_size or input_ids.size(0)
        logps, ents = [], []
        for s in range(0, input_ids.size(0), batch_size):
            ids, att = input_ids[s : s + batch_size], attention_mask[s : s + batch_size]
            logits = model(input_ids=ids, attention_mask=att, logits_to_keep=logits_to_keep + 1).logits[:, :-1]
            logp = (logits / trainer.temperature).log_softmax(-1)
            logps.append(logp.gather(-1, ids[:, -logits_to_keep:, None]).squeeze(-1))
            if compute_entropy:
                ents.append(-(logp.exp() * logp).sum(-1))
        return torch.cat(logps), (torch.cat(ents) if compute_entropy else None), None

    return head


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="completions per micro-batch (per_device_train_batch_size)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--chunks", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--no-full-logits", action="store_true", help="skip the full-logits reference case")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "chunked_logps.md"))
    p.add_argument("--in-process", action="store_true", help="no subprocesses (smoke tests; numbers not isolated)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.child, args)))
        return []
    shared = [a for a in argv if a not in ("--no-full-logits", "--in-process")]
    cases = ["trl", *[f"chunk={c}" for c in args.chunks]] + ([] if args.no_full_logits else ["full logits"])
    rows = [_measure(case, args) if args.in_process else run_case(__file__, case, shared) for case in cases]
    base = max(rows[0]["peak_mib"], 1e-9)  # at smoke-test sizes the step may not raise the high-water mark at all
    b, tp, tc, v = args.batch, args.prompt_len, args.completion_len, args.vocab
    lines = [
        "# Chunked log-probs: peak memory of one GRPO loss step (CPU)",
        "",
        f"`python benchmarks/chunked_logps.py {' '.join(argv)}`".replace(" `", "`"),
        "",
        (
            f"Tiny Llama, vocab {v:,}, hidden {args.hidden}, 2 layers, untied head, float32, full fine-tuning; "
            f"{b} completions × ({tp} prompt + {tc} completion tokens, right-padded to random lengths "
            f"≥ {tc // 2}); "
            "TRL's `dapo` loss; forward + backward. Peak = resident-set high-water mark during the step minus the "
            "resident set before it, one fresh process per case after a warm-up step. For scale: one fp32 "
            f"`B×T_c×V` logits tensor is {b * tc * v * 4 / 2**20:,.0f} MiB."
        ),
        "",
        "| case | peak over baseline (MiB) | ratio vs plain TRL | step time (s) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['peak_mib']:,.0f} | {r['peak_mib'] / base:.2f} | {r['seconds']:.2f} |")
    lines += [
        "",
        (
            "`trl` is TRL 1.16's fused LM head (no flag). `chunk=N` is `logps_chunk_size=N`. `full logits` is a "
            "reference only: `model(...).logits` + `log_softmax`, the head the memory facts file models."
        ),
        (
            "On CUDA TRL's head runs a Triton kernel in place on one bf16 tile and skips prompt positions, so expect "
            "a ratio closer to 1 there; not measured here."
        ),
        (
            "Step times are wall-clock on a shared 2-core machine while other jobs ran: not a speed comparison (the "
            "chunked path does one extra LM-head matmul per chunk in the backward)."
        ),
        "",
    ]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines))
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
