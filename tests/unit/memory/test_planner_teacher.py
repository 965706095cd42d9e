"""Memory planner with dGRPO's teacher (`opd_teacher_model`): resident weights in the policy's dtype and a transient
no-grad log-prob pass with the teacher's sizes; hand-derived, and read from a config as a recipe builds it."""

from pathlib import Path

import pytest
import yaml

from trl_groupx.memory import GiB, plan_memory, weight_bytes
from trl_groupx.memory.architectures import resolve_architecture
from trl_groupx.memory.planner import teacher_logprob_bytes

STUDENT, TEACHER = "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "dgrpo.yaml"
KW = dict(lora_r=64, num_generations=8, per_device_train_batch_size=8, gradient_accumulation_steps=4,
          prompt_length=512, completion_length=1024, suggest=False)


def test_teacher_weights_and_pass_by_hand():
    plain = plan_memory(STUDENT, **KW)
    plan = plan_memory(STUDENT, teacher_model=TEACHER, **KW)
    teacher = resolve_architecture(TEACHER)
    assert plan.teacher_model == weight_bytes(teacher, "bfloat16") == 2 * teacher.num_params
    # one layer of Qwen2.5-7B (H 3584, q 3584, kv 4·128 = 512, I 18944) for B·T = 8·1536 bf16 tokens:
    #   12288·(2·3584 + 3584 + 2·512 + 2·18944)·2 = 12288·99328 = 1,220,542,464
    # + the fused head on N = 8·1024 completion tokens: N·H·2 + 4096·32768·2 + 9·4·N = 58,720,256 + 268,435,456
    #   + 294,912                                                                  → 1,547,993,088
    assert plan.teacher_logprobs == teacher_logprob_bytes(plan.inputs) == 1_547_993_088
    assert plain.teacher_model == plain.teacher_logprobs == 0
    # here the pass (1.44 GiB) stays below the student's activations + head, so the transient is unchanged and the
    # peak grows by exactly the teacher's weights
    assert plan.teacher_logprobs < plain.activations + plain.logprob_head
    assert plan.train_peak - plain.train_peak == plan.teacher_model
    assert "teacher model (dGRPO, frozen)" in plan.report()


def test_teacher_of_a_4bit_policy_is_bf16():
    plan = plan_memory(STUDENT, teacher_model=TEACHER, load_in_4bit=True, **KW)
    assert plan.teacher_model == weight_bytes(resolve_architecture(TEACHER), "bfloat16")


def test_recipe_plans_with_its_teacher_and_fits_40gb(tmp_path):
    from trl_groupx.script import make_parser

    _, training_args, model_args = make_parser().parse_args_and_config(
        ["--config", str(RECIPE), "--output_dir", str(tmp_path), "--use_cpu", "true"])
    from trl_groupx.memory import plan_from_config

    plan = plan_from_config(training_args, model_args, gpu_memory_gib=40.0)
    assert yaml.safe_load(RECIPE.read_text())["opd_teacher_model"] == TEACHER
    assert plan.teacher_model == weight_bytes(resolve_architecture(TEACHER), "bfloat16")
    assert plan.verdict == "fits" and plan.peak < 30 * GiB
    training_args.opd_coef = 0.0  # λ = 0: the trainer loads no teacher, so none is planned
    assert plan_from_config(training_args, model_args).teacher_model == 0


@pytest.mark.parametrize("bad", ["not/a-model"])
def test_unknown_teacher_names_the_fix(bad):
    with pytest.raises(ValueError, match="unknown model"):
        plan_memory(STUDENT, teacher_model=bad, **KW)
