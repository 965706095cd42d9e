"""Memory planner with RTO's DPO model (`rto_dpo_model`): planned as dGRPO's teacher (resident weights in the
policy's dtype, a transient no-grad log-prob pass), read from a config."""

from trl_groupx import GRPOConfig
from trl_groupx.memory import plan_from_config, weight_bytes
from trl_groupx.memory.architectures import resolve_architecture

POLICY, DPO_MODEL = "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"


def _config(tmp_path, **flags):
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=True, num_generations=8,
                      per_device_train_batch_size=8, max_completion_length=1024, model_init_kwargs=None, **flags)


class _ModelArgs:
    model_name_or_path = POLICY
    dtype = "bfloat16"
    use_peft = True
    lora_r = 64
    lora_target_modules = "all-linear"
    lora_dropout = 0.0
    load_in_4bit = False
    use_bnb_nested_quant = False


def test_dpo_model_is_planned_like_the_teacher(tmp_path):
    plain = plan_from_config(_config(tmp_path), _ModelArgs(), gpu_memory_gib=40.0)
    plan = plan_from_config(_config(tmp_path, token_weighting="rto", rto_dpo_model=DPO_MODEL), _ModelArgs(),
                            gpu_memory_gib=40.0)
    dpo = resolve_architecture(DPO_MODEL)
    assert plain.teacher_model == 0
    assert plan.teacher_model == weight_bytes(dpo, "bfloat16") == 2 * dpo.num_params
    assert plan.teacher_logprobs > 0
    assert plan.train_peak - plain.train_peak >= plan.teacher_model
