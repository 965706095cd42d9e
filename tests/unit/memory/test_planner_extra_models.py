"""Memory planner terms of the variants that build extra models or buffers: SPPO's value model (fp32 + its AdamW,
and its update as a transient), S2L-PO's frozen explorer (weights, and generate() on it), logit averaging's frozen
reference copy (full fine-tuning only), its plain-logits head and second KV cache, and SRPO's teacher targets,
self-teacher, student head and teacher pass. Hand-derived sizes; read from
the recipes as `plan_from_config` builds them; off by default."""

import json
from pathlib import Path

import pytest

from trl_groupx.memory import plan_from_config, plan_memory, weight_bytes
from trl_groupx.memory.architectures import resolve_architecture
from trl_groupx.memory.planner import value_model_params

POLICY = "Qwen/Qwen2.5-1.5B-Instruct"
RECIPES = Path(__file__).resolve().parents[3] / "recipes"
KW = dict(lora_r=64, num_generations=8, per_device_train_batch_size=8, gradient_accumulation_steps=1,
          prompt_length=512, completion_length=1024, suggest=False)
# Qwen2.5-1.5B: P = L·(H·q + 2H·kv + q·H + 3H·I) + L·(2H + q + 2kv) + V·H + H
#   = 28·46,792,704 + 28·5,120 + 151,936·1,536 + 1,536 = 1,543,714,304; bf16 weights 2P
POLICY_PARAMS, POLICY_BF16 = 1_543_714_304, 3_087_428_608
# LoRA r=64 all-linear: r·L·(7H + 2q + 2kv + 3I) = 64·28·(10,752 + 3,072 + 512 + 26,880) = 73,859,072
POLICY_LORA = 73_859_072


def _resident(plan) -> int:
    """The resident terms of a plan (what is held through both phases, vLLM aside)."""
    return (plan.weights + plan.adapter_optimizer + plan.reference_model + plan.teacher_model + plan.value_model
            + plan.explorer_model + plan.logit_avg_reference + plan.srpo_teacher + plan.srpo_targets
            + plan.cuda_context)


def test_hand_derived_policy_sizes():
    assert resolve_architecture(POLICY).num_params == POLICY_PARAMS
    assert plan_memory(POLICY, **KW).adapter_optimizer == POLICY_LORA * 16


def test_all_new_terms_are_off_by_default():
    plan = plan_memory(POLICY, **KW)
    assert (plan.value_model, plan.value_update, plan.explorer_model, plan.explorer_generation,
            plan.logit_avg_reference, plan.srpo_teacher, plan.srpo_targets, plan.logit_avg_generation,
            plan.srpo_teacher_pass) == (0,) * 9


# ---- SPPO's value model -----------------------------------------------------------------------------------------


def test_sppo_value_model_by_hand():
    plain = plan_memory(POLICY, **KW)
    plan = plan_memory(POLICY, value_model="Qwen/Qwen2.5-0.5B-Instruct", **KW)
    # Qwen2.5-0.5B (H 896, L 24, q 896, kv 2·64 = 128, I 4864, V 151,936, tied, qkv bias):
    #   P_lin = 24·(896·896 + 2·896·128 + 896·896 + 3·896·4864) = 24·14,909,440 = 357,826,560
    #   P = P_lin + 24·(2·896 + 896 + 2·128) + 151,936·896 + 896 = 494,032,768
    #   token-classification model: one embedding matrix (tied: the same), no lm_head, head 896 → 1 with bias:
    #   P_v = P + 896 + 1 = 494,033,665
    assert value_model_params(resolve_architecture("Qwen/Qwen2.5-0.5B-Instruct")) == 494_033_665
    # resident: fp32 weights + two fp32 AdamW states = 12·P_v
    assert plan.value_model == 12 * 494_033_665 == 5_928_403_980
    # update (bf16 autocast): fp32 grads 4·P_v = 1,976,134,660
    #   + cached bf16 linear weights 2·(P_lin + H) = 2·357,827,456 = 715,654,912
    #   + activations, no checkpointing, B = 8 prompts of 512 tokens over 24 layers:
    #     2·8·512·24·(4·896 + 2·896 + 2·128 + 4·4864) = 196,608·25,088 = 4,932,501,504
    assert plan.value_update == 1_976_134_660 + 715_654_912 + 4_932_501_504 == 7_624_291_076
    # the update is larger than the policy's activations + head, so it sets the transient (and its fragmentation)
    assert plan.value_update > plain.activations + plain.logprob_head
    assert plan.fragmentation == round(plan.value_update * 0.1)
    assert plan.train_peak == _resident(plan) + plan.value_update + plan.fragmentation
    assert plan.generation_peak - plain.generation_peak == plan.value_model
    assert "value model + AdamW (SPPO, fp32)" in plan.report()


def test_sppo_value_update_in_fp32_without_autocast():
    plan = plan_memory(POLICY, value_model="Qwen/Qwen2.5-0.5B-Instruct", bf16=False, weight_dtype="float32", **KW)
    # no autocast: no bf16 weight copies, fp32 activations (twice the bf16 figure above)
    assert plan.value_update == 1_976_134_660 + 2 * 4_932_501_504


def test_sppo_recipe_plans_its_value_model(tmp_path):
    plan = _recipe_plan(tmp_path, "sppo")
    assert plan.value_model == 12 * value_model_params(resolve_architecture("Qwen/Qwen2.5-0.5B-Instruct"))
    assert plan.value_update > 0 and plan.verdict == "fits"


# ---- S2L-PO's explorer ------------------------------------------------------------------------------------------


# Qwen3-0.6B-Base (H 1024, L 28, q 16·128 = 2048, kv 8·128 = 1024, I 3072, V 151,936, tied, q/k-norm):
#   P = 28·(1024·2048 + 2·1024·1024 + 2048·1024 + 3·1024·3072) + 28·(2·1024 + 2·128) + 151,936·1024 + 1024
#     = 440,401,920 + 64,512 + 155,582,464 + 1,024 = 596,049,920; bf16 weights 1,192,099,840
EXPLORER = "Qwen/Qwen3-0.6B-Base"
EXPLORER_BF16 = 1_192_099_840


def test_explorer_weights_and_its_generate_by_hand():
    plain = plan_memory("Qwen/Qwen2.5-1.5B", **KW)
    plan = plan_memory("Qwen/Qwen2.5-1.5B", explorer_model=EXPLORER, **KW)
    assert plan.explorer_model == EXPLORER_BF16 == weight_bytes(resolve_architecture(EXPLORER), "bfloat16")
    # generate() on 8 sequences of 512 + 1024 tokens, bf16:
    #   explorer: KV 8·1536·2·28·1024·2 = 1,409,286,144 + prefill 8·512·(1024 + 2048 + 2·1024 + 2·3072)·2
    #     = 92,274,688 → ×1.1 = 1,651,716,915.2 → 1,651,716,915
    #   policy Qwen2.5-1.5B (kv 256): KV 8·1536·2·28·256·2 = 352,321,536 + prefill 8·512·(1536 + 1536 + 512
    #     + 17,920)·2 = 176,160,768 → ×1.1 = 581,330,534.4 → 581,330,534
    # (the explorer is from another family here only to have the larger KV cache: the max picks it)
    assert plan.explorer_generation == 1_651_716_915 and plan.hf_generation == plain.hf_generation == 581_330_534
    assert plan.generation_peak == _resident(plan) + plan.explorer_generation
    assert plan.train_peak - plain.train_peak == EXPLORER_BF16  # frozen: no optimizer, no training transient
    assert "explorer model (S2L-PO, frozen)" in plan.report()


def test_smaller_explorer_cache_leaves_the_policy_generate_peak():
    # Qwen3-1.7B-Base has the explorer's KV width (kv 1024, 28 layers) and a wider MLP: its prefill is larger
    #   policy: 1,409,286,144 + 8·512·(2048 + 2048 + 2·1024 + 2·6144)·2 = 150,994,944 → ×1.1 = 1,716,309,196.8
    plain = plan_memory("Qwen/Qwen3-1.7B-Base", **KW)
    plan = plan_memory("Qwen/Qwen3-1.7B-Base", explorer_model=EXPLORER, **KW)
    assert plan.hf_generation == 1_716_309_197 > plan.explorer_generation == 1_651_716_915
    assert plan.generation_peak - plain.generation_peak == EXPLORER_BF16


def test_explorer_of_a_4bit_policy_is_bf16_and_vllm_is_refused():
    plan = plan_memory(POLICY, explorer_model=EXPLORER, load_in_4bit=True, **KW)
    assert plan.explorer_model == EXPLORER_BF16
    with pytest.raises(ValueError, match="explorer.*vLLM|vLLM.*explorer"):
        plan_memory(POLICY, explorer_model=EXPLORER, use_vllm=True, **KW)


def test_s2l_po_recipe_plans_its_explorer(tmp_path):
    plan = _recipe_plan(tmp_path, "s2l_po")
    assert plan.explorer_model == EXPLORER_BF16 and plan.explorer_generation > 0
    no_explorer = _recipe_plan(tmp_path, "s2l_po", s2l_po_anneal_steps=0)  # anneal 0: the trainer loads none
    assert no_explorer.explorer_model == no_explorer.explorer_generation == 0


# ---- logit averaging's reference copy ---------------------------------------------------------------------------


# B·(T_c+1)·V = 8·1025·151,936 = 1,245,875,200 completion logits per micro-batch
LOGITS = 1_245_875_200
# one layer of a no-grad pass, B·T·(2H + q + 2kv + 2I)·e = 8·1536·(3072 + 1536 + 512 + 17,920)·2
NOGRAD_LAYER = 566_231_040


def _transient_step(plan) -> int:
    """What the training step adds to the resident terms: activations + head, and the fragmentation on them."""
    return plan.activations + plan.logprob_head + plan.fragmentation


def test_logit_avg_reference_copy_head_and_generation_under_full_fine_tuning():
    full_plain = plan_memory(POLICY, use_peft=False, **KW)
    full = plan_memory(POLICY, use_peft=False, logit_avg=True, **KW)
    assert full.logit_avg_reference == POLICY_BF16 == full.weights  # a frozen bf16 copy of the policy, 2P
    # plain logits of policy and reference (bf16, 2 + 2) and five float32 (B, T_c+1, V) tensors: 24 bytes each
    assert full.logprob_head == LOGITS * 24 == 29_901_004_800
    assert full.train_peak - full_plain.train_peak == POLICY_BF16 + _transient_step(full) - _transient_step(full_plain)
    # generate(): the reference runs beside the policy with its own KV cache and prefill, the same size
    assert full.logit_avg_generation == full.hf_generation > 0
    assert full.generation_peak - full_plain.generation_peak == POLICY_BF16 + full.hf_generation
    report = full.report()
    assert "logit-averaging reference (frozen copy)" in report and "logit-averaging reference KV cache" in report
    # next to TRL's own reference of beta != 0: two copies
    both = plan_memory(POLICY, use_peft=False, logit_avg=True, beta=0.04, **KW)
    assert both.reference_model == both.logit_avg_reference == POLICY_BF16
    # a no-grad pass (old log-probs): one layer + the mixed head without the entropy's two temporaries (16 bytes)
    old = plan_memory(POLICY, use_peft=False, logit_avg=True, num_iterations=2, **KW)
    assert old.nograd_logprobs == NOGRAD_LAYER + LOGITS * 16 == 20_500_234_240


def test_logit_avg_under_lora_adds_the_head_and_the_generation_but_no_copy():
    plain = plan_memory(POLICY, **KW)
    lora = plan_memory(POLICY, logit_avg=True, **KW)  # the reference is the policy with its adapter disabled
    assert lora.logit_avg_reference == 0 and lora.weights == plain.weights
    assert lora.logprob_head == LOGITS * 24 and lora.logit_avg_generation == lora.hf_generation
    assert lora.train_peak - plain.train_peak == _transient_step(lora) - _transient_step(plain)


def test_logit_avg_recipe_with_lora_adds_no_copy(tmp_path):
    plan = _recipe_plan(tmp_path, "logit_avg")
    assert plan.inputs.logit_avg and plan.logit_avg_reference == 0 and plan.logit_avg_generation > 0


# ---- SRPO -------------------------------------------------------------------------------------------------------


def test_srpo_targets_and_lora_ema_teacher_by_hand():
    plain = plan_memory(POLICY, **KW)
    plan = plan_memory(POLICY, srpo_distill_topk=100, **KW)
    # N = 8 rows, T_c = 1024, k = 100: int64 ids + fp32 log-probs 8·1024·100·12 = 9,830,400, fp32 weights
    # 8·1024·4 = 32,768, bool routing 8
    assert plan.srpo_targets == 9_863_176
    # LoRA "ema": TRL's second adapter (fp32) + its shadow (fp32, the student adapter's dtype): N_lora·8
    assert plan.srpo_teacher == POLICY_LORA * 8 == 590_872_576
    # the student's head on routed micro-batches: plain bf16 logits and their gradient, 2·2 bytes each, and one
    # row's float32 tempered copy, log-softmax and gradient, 3·T_c·V·4 = 1,866,989,568 (larger than the fused head)
    assert plan.logprob_head == LOGITS * 4 + 1_866_989_568 == 6_850_490_368 > plain.logprob_head
    # the teacher's no-grad pass: one layer + plain logits B·(T_c+1)·V·2 + one float32 row (T_c+1)·V·4
    #   + four float32 row copies 4·T_c·V·4
    assert plan.srpo_teacher_pass == NOGRAD_LAYER + LOGITS * 2 + 1025 * 151_936 * 4 + 4 * 1024 * 151_936 * 4
    assert plan.train_peak - plain.train_peak == (plan.srpo_targets + plan.srpo_teacher + _transient_step(plan)
                                                  - _transient_step(plain))
    assert plan.generation_peak - plain.generation_peak == plan.srpo_targets + plan.srpo_teacher
    report = plan.report()
    assert "SRPO self-teacher (EMA adapter + shadow)" in report and "SRPO teacher top-k targets" in report


def test_srpo_targets_scale_with_the_generation_batch_and_cap_k_at_the_vocabulary():
    plan = plan_memory(POLICY, srpo_distill_topk=100, **{**KW, "per_device_train_batch_size": 4,
                                                         "gradient_accumulation_steps": 8})
    # N = 4·8 = 32: 32·1024·100·12 + 32·1024·4 + 32 = 39,321,600 + 131,072 + 32
    assert plan.srpo_targets == 39_452_704
    from trl_groupx.toy import tiny_model_path

    tiny = plan_memory(tiny_model_path(), srpo_distill_topk=500, num_generations=4, prompt_length=16,
                       completion_length=16, suggest=False)
    # vocabulary 104 < 500: k = 104; N = 4: 4·16·104·12 + 4·16·4 + 4 = 79,872 + 256 + 4
    assert tiny.srpo_targets == 79_872 + 256 + 4 == 80_132


@pytest.mark.parametrize(("use_peft", "kind", "load_in_4bit", "expected"), [
    (False, "ema", False, POLICY_BF16),  # full fine-tuning: a frozen copy of the policy
    (False, "base", False, POLICY_BF16),  # the initial policy: a frozen copy too
    (False, "live", False, 0),
    (True, "base", False, 0),  # the policy with its adapter disabled
    (True, "live", False, 0),
    (True, "ema", True, POLICY_LORA * 6),  # QLoRA: fp32 teacher adapter + bf16 shadow
])
def test_srpo_teacher_by_kind(use_peft, kind, load_in_4bit, expected):
    plan = plan_memory(POLICY, use_peft=use_peft, srpo_distill_topk=100, srpo_teacher_kind=kind,
                       load_in_4bit=load_in_4bit, **KW)
    assert plan.srpo_teacher == expected
    assert plan.srpo_targets == 9_863_176  # every kind stores the targets


def test_srpo_bad_settings_name_the_fix():
    with pytest.raises(ValueError, match="srpo_teacher_kind='old'"):
        plan_memory(POLICY, srpo_distill_topk=100, srpo_teacher_kind="old", **KW)
    with pytest.raises(ValueError, match="srpo_distill_topk must be a positive integer"):
        plan_memory(POLICY, srpo_distill_topk=0, **KW)


def test_srpo_recipe_plans_its_targets_and_teacher(tmp_path):
    plan = _recipe_plan(tmp_path, "srpo")
    assert plan.srpo_targets == 39_452_704  # B 4 × steps_per_generation 8, T_c 1024, k 100 (hand-derived above)
    assert plan.srpo_teacher == POLICY_LORA * 8 and plan.verdict == "fits"
    other = _recipe_plan(tmp_path, "srpo", loss_type="dapo")
    assert other.srpo_targets == other.srpo_teacher == 0


# ---- CLI --------------------------------------------------------------------------------------------------------


def test_cli_flags(capsys):
    from trl_groupx.cli import main

    main(["plan", "--model", POLICY, "--no-use_peft", "--rollout_filter", "logit_avg", "--loss_type", "srpo",
          "--sppo_value_model", "Qwen/Qwen2.5-0.5B-Instruct", "--s2l_po_explorer_model", EXPLORER, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["logit_avg_reference"] == data["srpo_teacher"] == POLICY_BF16
    assert data["value_model"] == 5_928_403_980 and data["explorer_model"] == EXPLORER_BF16
    assert data["srpo_targets"] > 0
    main(["plan", "--model", POLICY, "--rollout_filter", "logit_avg"])  # LoRA: no reference copy, a second KV cache
    out = capsys.readouterr().out
    assert "logit-averaging reference (frozen copy)" not in out and "logit-averaging reference KV cache" in out


def _recipe_plan(tmp_path, recipe: str, **overrides):
    from trl_groupx.script import make_parser

    _, training_args, model_args = make_parser().parse_args_and_config(
        ["--config", str(RECIPES / f"{recipe}.yaml"), "--output_dir", str(tmp_path), "--use_cpu", "true"])
    for key, value in overrides.items():
        setattr(training_args, key, value)
    return plan_from_config(training_args, model_args, gpu_memory_gib=40.0, suggest=False)
