"""`trl-groupx plan`: the memory planner on the command line (flags named like `GRPOConfig`/`ModelConfig` fields)."""

from __future__ import annotations

import argparse
import json

from .architectures import KNOWN_MODELS
from .planner import plan_memory


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trl-groupx plan",
        description="Peak GPU memory of single-GPU GRPO, with a verdict and the settings that would make it fit.",
    )
    p.add_argument("--model", help="shipped name (--list_models), a config.json path, or a local model folder")
    p.add_argument("--list_models", action="store_true", help="print the shipped model names and exit")
    g = p.add_argument_group("model / LoRA")
    g.add_argument("--use_peft", action=argparse.BooleanOptionalAction, default=True,
                   help="LoRA (default) or, with --no-use_peft, full fine-tuning")
    g.add_argument("--lora_r", type=int, default=16)
    g.add_argument("--lora_target_modules", nargs="+", default=["all-linear"])
    g.add_argument("--lora_dropout", type=float, default=0.0)
    g.add_argument("--load_in_4bit", action="store_true", help="QLoRA: NF4 base")
    g.add_argument("--use_bnb_nested_quant", action="store_true", help="NF4 double quantisation")
    g.add_argument("--dtype", default="bfloat16", help="dtype the policy is loaded in (bfloat16, float32, fp8)")
    g.add_argument("--optim", default="adamw_torch")
    t = p.add_argument_group("GRPO")
    t.add_argument("--num_generations", type=int, default=8)
    t.add_argument("--per_device_train_batch_size", type=int, default=None, help="default: num_generations")
    t.add_argument("--gradient_accumulation_steps", type=int, default=1)
    t.add_argument("--steps_per_generation", type=int, default=None)
    t.add_argument("--prompt_length", type=int, default=512)
    t.add_argument("--max_completion_length", "--completion_length", dest="completion_length", type=int,
                   default=1024)
    t.add_argument("--gradient_checkpointing", action=argparse.BooleanOptionalAction, default=True)
    t.add_argument("--use_liger_kernel", action="store_true")
    t.add_argument("--logps_chunk_size", type=int, default=None, help="trl_groupx chunked log-probs: rows per chunk")
    t.add_argument("--prefix_grouper", action="store_true",
                   help="trl_groupx shared-prefix forward: each prompt encoded once per group (needs "
                   "--no-gradient_checkpointing)")
    t.add_argument("--generation_micro_group_size", type=int, default=None,
                   help="trl_groupx micro sampling groups: generate() at most this many sequences at a time")
    t.add_argument("--logprob_head", default="trl-fused", choices=["trl-fused", "unfused", "liger"],
                   help="trl-fused: TRL 1.16's tiled LM head (default); unfused: full logits (older TRL)")
    t.add_argument("--beta", type=float, default=0.0)
    t.add_argument("--num_iterations", type=int, default=1)
    x = p.add_argument_group("variants with extra models or buffers")
    x.add_argument("--sppo_value_model", default=None,
                   help="SPPO (advantage_estimator=sppo): the value model, resolved like --model (fp32 + its AdamW)")
    x.add_argument("--s2l_po_explorer_model", default=None,
                   help="S2L-PO (rollout_filter=s2l_po): the frozen explorer, resolved like --model")
    x.add_argument("--loss_type", default=None, help="srpo plans SRPO's teacher targets and self-teacher")
    x.add_argument("--rollout_filter", default=None, help="logit_avg plans its frozen reference copy (full FT)")
    x.add_argument("--srpo_distill_topk", type=int, default=100, help="SRPO: k of the stored teacher top-k")
    x.add_argument("--srpo_teacher_kind", default="ema", choices=["ema", "live", "base"])
    v = p.add_argument_group("generation")
    v.add_argument("--use_vllm", action="store_true")
    v.add_argument("--vllm_mode", default="colocate", choices=["colocate", "server"])
    v.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.3)
    v.add_argument("--vllm_enable_sleep_mode", action="store_true")
    v.add_argument("--vllm_max_model_length", type=int, default=None)
    v.add_argument("--vllm_enforce_eager", action="store_true")
    h = p.add_argument_group("GPU")
    h.add_argument("--gpu_gb", type=float, default=40.0, help="GPU size in GiB (default 40: A100-40GB)")
    h.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    ns = parser.parse_args(argv)
    if ns.list_models:
        print("\n".join(KNOWN_MODELS))
        return
    if not ns.model:
        parser.error("--model is required (a shipped name, a config.json path or a local model folder)")
    try:
        plan = plan_memory(
            ns.model, use_peft=ns.use_peft, lora_r=ns.lora_r, lora_target_modules=ns.lora_target_modules,
            lora_dropout=ns.lora_dropout, load_in_4bit=ns.load_in_4bit, bnb_double_quant=ns.use_bnb_nested_quant,
            weight_dtype=ns.dtype, optim=ns.optim, num_generations=ns.num_generations,
            per_device_train_batch_size=ns.per_device_train_batch_size,
            gradient_accumulation_steps=ns.gradient_accumulation_steps, steps_per_generation=ns.steps_per_generation,
            prompt_length=ns.prompt_length, completion_length=ns.completion_length,
            gradient_checkpointing=ns.gradient_checkpointing, use_liger_kernel=ns.use_liger_kernel,
            logps_chunk_size=ns.logps_chunk_size, logprob_head=ns.logprob_head, beta=ns.beta,
            prefix_grouper=ns.prefix_grouper, generation_micro_group_size=ns.generation_micro_group_size,
            num_iterations=ns.num_iterations, use_vllm=ns.use_vllm, vllm_mode=ns.vllm_mode,
            vllm_gpu_memory_utilization=ns.vllm_gpu_memory_utilization,
            vllm_enable_sleep_mode=ns.vllm_enable_sleep_mode, vllm_max_model_length=ns.vllm_max_model_length,
            vllm_enforce_eager=ns.vllm_enforce_eager, gpu_memory_gib=ns.gpu_gb,
            value_model=ns.sppo_value_model, explorer_model=ns.s2l_po_explorer_model,
            logit_avg=ns.rollout_filter == "logit_avg",
            srpo_distill_topk=ns.srpo_distill_topk if ns.loss_type == "srpo" else None,
            srpo_teacher_kind=ns.srpo_teacher_kind,
        )
    except ValueError as e:
        parser.exit(2, f"trl-groupx plan: error: {e}\n")
    print(json.dumps(plan.to_dict(), indent=1, default=str) if ns.json else plan.report())
