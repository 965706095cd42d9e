"""Memory planner against a real GPU (never run in CI): peak memory of one GRPO training step for a few planner rows.

    python benchmarks/gpu/memory_check.py                     # on a GPU machine, ~5 minutes; 40 GB card emulated
    python benchmarks/gpu/memory_check.py --gpu_gb 80         # emulate another card size
    python benchmarks/gpu/memory_check.py --cpu-dry-run       # tiny sizes on CPU: checks the script runs (CI smoke)

No download happens: each row's model is built from the architecture constants the planner ships
(`trl_groupx.memory.KNOWN_MODELS`) with random weights, which use the same memory as the real checkpoint. Every row
runs one TRL GRPO training step (forward and backward of `loss_type="dapo"` on full-length synthetic completions,
plus the optimizer step, so the adapter's AdamW states exist) under `torch.cuda.set_per_process_memory_fraction`
(so a bigger card behaves like a 40 GB one), and reports `torch.cuda.max_memory_allocated` and
`max_memory_reserved` next to the planner's training-step prediction. Generation (vLLM or transformers) is not
exercised: the rows measure the training step, the term the planner models from first principles.
Writes `benchmarks/results/gpu_memory_check.md` (or `--output`).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_key, "1")

GiB = 2**30

# (model, LoRA rank, per-device batch, prompt tokens, completion tokens, gradient checkpointing)
ROWS = [
    ("Qwen/Qwen2.5-0.5B", 16, 8, 256, 512, True),
    ("Qwen/Qwen2.5-1.5B", 16, 8, 256, 1024, True),
    ("Qwen/Qwen2.5-1.5B", 16, 8, 256, 512, False),
    ("Qwen/Qwen2.5-3B", 16, 4, 256, 1024, True),
    ("Qwen/Qwen2.5-7B", 16, 4, 256, 512, True),
]
DRY_ROWS = [("tiny", 4, 4, 8, 8, True), ("tiny", 4, 4, 8, 8, False)]


def hf_config(arch):
    """A transformers config with the planner's architecture constants (Qwen2 layout, Llama when no qkv bias)."""
    from transformers import AutoConfig

    kind = "qwen2" if arch.qkv_bias else "llama"
    return AutoConfig.for_model(
        kind, hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads, head_dim=arch.head_dim, intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size, tie_word_embeddings=arch.tie_word_embeddings,
        max_position_embeddings=arch.max_position_embeddings,
    )


def tiny_architecture():
    from trl_groupx.memory import Architecture

    return Architecture(name="tiny", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=512)


def measure(row, device: str, workdir: Path) -> dict:
    """Peak memory of one training step (forward, backward, optimizer step) of TRL's GRPO loss on this row."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    import trl_groupx
    from trl_groupx.memory import resolve_architecture

    name, rank, batch, prompt_len, completion_len, checkpointing = row
    arch = tiny_architecture() if name == "tiny" else resolve_architecture(name)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=dtype)
    args = trl_groupx.GRPOConfig(
        output_dir=str(workdir), use_cpu=device == "cpu", bf16=device != "cpu", per_device_train_batch_size=batch,
        num_generations=batch, max_completion_length=completion_len, gradient_checkpointing=checkpointing,
        loss_type="dapo", beta=0.0, report_to="none", save_strategy="no", learning_rate=1e-5,
    )
    data = Dataset.from_dict({"prompt": ["x"] * batch})
    trainer = trl_groupx.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=data,
        processing_class=_tokenizer(arch.vocab_size), peft_config=LoraConfig(r=rank, lora_alpha=2 * rank,
                                                                             target_modules="all-linear"),
    )
    trainer.create_optimizer()
    gen = torch.Generator().manual_seed(0)
    dev = trainer.accelerator.device
    inputs = {
        "prompt_ids": torch.randint(0, arch.vocab_size, (batch, prompt_len), generator=gen).to(dev),
        "prompt_mask": torch.ones(batch, prompt_len, dtype=torch.long, device=dev),
        "completion_ids": torch.randint(0, arch.vocab_size, (batch, completion_len), generator=gen).to(dev),
        "completion_mask": torch.ones(batch, completion_len, dtype=torch.long, device=dev),
        "advantages": torch.randn(batch, generator=gen).to(dev),
        "num_items_in_batch": torch.tensor(float(batch * completion_len), device=dev),
    }
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    if device != "cpu":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    allocated = torch.cuda.max_memory_allocated() if device != "cpu" else 0
    reserved = torch.cuda.max_memory_reserved() if device != "cpu" else 0
    plan = trl_groupx.memory.plan_memory(
        arch, use_peft=True, lora_r=rank, num_generations=batch, per_device_train_batch_size=batch,
        prompt_length=prompt_len, completion_length=completion_len, gradient_checkpointing=checkpointing,
        suggest=False,
    )
    del trainer, model, loss
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()
    return {"row": row, "allocated": allocated, "reserved": reserved, "seconds": seconds, "plan": plan}


def _tokenizer(vocab_size: int):
    """A stand-in tokenizer: the step is fed token ids directly, TRL only needs pad/eos ids and a chat template."""
    from trl_groupx.toy import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    assert tok.pad_token_id < vocab_size
    return tok


def report(results: list[dict], device: str, gpu_gb: float) -> str:
    lines = [
        "# Memory planner vs one measured GRPO training step",
        "",
        f"`python benchmarks/gpu/memory_check.py` on {device}, card emulated at {gpu_gb:g} GiB. Random-weight models "
        "built from the planner's constants, LoRA on all linear layers, bf16, one forward + backward + AdamW step of "
        "`loss_type=\"dapo\"` on full-length completions. Planned = weights + adapter/optimizer + activations + "
        "log-prob head (the planner's training-step terms without CUDA context and fragmentation), to compare with "
        "`max_memory_allocated`; the planner's full training peak adds context and fragmentation (compare with "
        "`max_memory_reserved` + ~0.5 GiB of context).",
        "",
        "| model | r | B | prompt | completion | GC | planned (GiB) | allocated (GiB) | ratio | planner peak | "
        "reserved | step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        name, rank, batch, p, c, gc_on = r["row"]
        plan = r["plan"]
        planned = plan.weights + plan.adapter_optimizer + plan.activations + plan.logprob_head
        ratio = r["allocated"] / planned if planned and r["allocated"] else float("nan")
        lines.append(
            f"| {name} | {rank} | {batch} | {p} | {c} | {'on' if gc_on else 'off'} | {planned / GiB:.2f} | "
            f"{r['allocated'] / GiB:.2f} | {ratio:.2f} | {plan.train_peak / GiB:.2f} | {r['reserved'] / GiB:.2f} | "
            f"{r['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu_gb", type=float, default=40.0, help="card size to emulate (GiB)")
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny rows on CPU: the script runs (no numbers)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "gpu_memory_check.md"))
    ns = parser.parse_args(argv)
    import torch

    device = "cpu" if ns.cpu_dry_run else "cuda"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run on a GPU machine, or pass --cpu-dry-run")
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, ns.gpu_gb * GiB / total))
    results = []
    for row in DRY_ROWS if ns.cpu_dry_run else ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                results.append(measure(row, device, Path(tmp)))
            except torch.cuda.OutOfMemoryError as err:  # the planner should have said "does not fit"
                print(f"{row}: out of memory ({str(err).splitlines()[0]})", flush=True)
                continue
        print(report(results[-1:], device, ns.gpu_gb).splitlines()[-1], flush=True)
    text = report(results, torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)", ns.gpu_gb)
    Path(ns.output).write_text(text)
    return results


if __name__ == "__main__":
    main()
