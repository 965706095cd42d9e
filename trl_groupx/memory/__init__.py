"""Memory planner for single-GPU GRPO: `plan_memory(...)`, `plan_from_config(grpo_config, model_args)`,
`trl-groupx plan`. See docs/memory.md."""

from .architectures import KNOWN_MODELS, Architecture, architecture_from_config, resolve_architecture
from .planner import (
    GiB,
    MemoryPlan,
    PlanInputs,
    Suggestion,
    format_report,
    largest_vllm_utilization,
    lora_params,
    plan_from_config,
    plan_inputs,
    plan_memory,
    weight_bytes,
)

__all__ = [
    "KNOWN_MODELS", "Architecture", "GiB", "MemoryPlan", "PlanInputs", "Suggestion", "architecture_from_config",
    "format_report", "largest_vllm_utilization", "lora_params", "plan_from_config", "plan_inputs", "plan_memory",
    "resolve_architecture", "weight_bytes",
]
