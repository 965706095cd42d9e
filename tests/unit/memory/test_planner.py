"""Memory planner: checked against the reported runs of the facts file (single-gpu-memory.md §4.3), its planning
table (§4.4), hand-derived terms, monotonicity, bad input, config.json input and the CLI. No network, no GPU.

Tolerances are the facts file's: weights/KV ±5–8% ("predictable to ±5–8%"), activations + logits ±10–15%.
The reported runs predate TRL's fused LM head, so they are planned with `logprob_head="unfused"` (the facts file's
model of the head); the default is TRL 1.16's fused head.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_groupx.memory import KNOWN_MODELS, GiB, largest_vllm_utilization, lora_params, plan_memory, weight_bytes
from trl_groupx.memory.planner import activation_bytes, checkpoint_bytes, k_layer

LLAMA8 = "meta-llama/Llama-3.1-8B"
ROOT = Path(__file__).resolve().parents[3]


def rel(pred, ref):
    return abs(pred - ref) / ref


# ---------------------------------------------------------------------------------------------------------------
# §4.3 (1): weights vs vLLM logs (rows U-a, U-b, U-d, U-e/f, U-g, U-h, U-j)


@pytest.mark.parametrize(
    "model, fmt, dq, logged_gib, tol",
    [
        (LLAMA8, "nf4", False, 5.60, 0.05),
        ("Qwen/Qwen3-8B", "nf4", False, 5.91, 0.05),
        ("microsoft/phi-4", "nf4", True, 8.49, 0.05),  # logged 8.49 matches double quant (−0.4%)
        ("microsoft/phi-4", "nf4", False, 8.49, 0.08),  # plain NF4 +7%
        # Unsloth's dynamic 4-bit keeps some layers in 16 bit, so the log is 8% above plain NF4 (facts: −8%)
        ("Qwen/Qwen2.5-3B", "nf4", False, 2.22, 0.09),
        ("meta-llama/Llama-3.2-3B", "bfloat16", False, 6.25, 0.05),  # log includes LoRA slots r=64
        ("Qwen/Qwen3-4B", "bfloat16", False, 7.63, 0.05),  # log includes LoRA slots r=32
        ("meta-llama/Llama-3.2-1B", "fp8", False, 1.47, 0.06),
    ],
)
def test_weights_match_vllm_logs(model, fmt, dq, logged_gib, tol):
    pred = weight_bytes(KNOWN_MODELS[model], fmt, double_quant=dq) / GiB
    assert rel(pred, logged_gib) <= tol, (pred, logged_gib)


def test_weights_reproduce_the_facts_predictions():
    # the facts file's own predicted column, to 0.01 GiB: the formula is the same
    expected = {(LLAMA8, "nf4"): 5.61, ("Qwen/Qwen3-8B", "nf4"): 5.96, ("microsoft/phi-4", "nf4"): 9.06,
                ("Qwen/Qwen2.5-3B", "nf4"): 2.03, ("meta-llama/Llama-3.2-3B", "bfloat16"): 5.98,
                ("Qwen/Qwen3-4B", "bfloat16"): 7.49, ("meta-llama/Llama-3.2-1B", "fp8"): 1.40}
    for (model, fmt), gib in expected.items():
        assert weight_bytes(KNOWN_MODELS[model], fmt) / GiB == pytest.approx(gib, abs=0.01)


def test_kv_cache_matches_vllm_logs():
    # Llama-3.2-3B on an A100-40GB at u=0.79 with the logged profile (1.49) and non-torch (0.09) GiB, eager:
    # KV = 0.79·39.56 − W − 1.49 − 0.09; logged 23.46 GiB
    p = plan_memory("meta-llama/Llama-3.2-3B", use_vllm=True, vllm_gpu_memory_utilization=0.79,
                    vllm_max_model_length=2048, vllm_profile_gib=1.49, vllm_nontorch_gib=0.09,
                    vllm_enforce_eager=True, suggest=False)
    assert p.usable_bytes / GiB == pytest.approx(39.56, abs=0.01)
    assert rel(p.vllm_kv_cache / GiB, 23.46) <= 0.05
    assert p.kv_tokens // 2048 == pytest.approx(107, abs=5)  # facts: 219K tokens = 107 concurrent 2048-token seqs
    # Llama-3.2-1B: 17.20 GiB of KV at 32 KiB/token = 563,610 tokens (logged 563,744)
    assert KNOWN_MODELS["meta-llama/Llama-3.2-1B"].kv_bytes_per_token == 32 * 1024
    assert rel(17.20 * GiB // (32 * 1024), 563_744) < 0.001


@pytest.mark.parametrize("model, kib", [
    ("Qwen/Qwen2.5-0.5B", 12), ("Qwen/Qwen2.5-1.5B", 28), ("Qwen/Qwen2.5-3B", 36), ("Qwen/Qwen2.5-7B", 56),
    ("Qwen/Qwen3-0.6B", 112), ("Qwen/Qwen3-1.7B", 112), ("Qwen/Qwen3-4B", 144), ("Qwen/Qwen3-8B", 144),
    ("meta-llama/Llama-3.2-1B", 32), ("meta-llama/Llama-3.2-3B", 112), (LLAMA8, 128),
])
def test_kv_bytes_per_token_table(model, kib):
    assert KNOWN_MODELS[model].kv_bytes_per_token == kib * 1024  # facts §4.2 (6)


def test_param_counts_match_model_cards():
    # published totals: Qwen2.5-1.5B 1.54B (1.31B non-embedding), Llama-3.1-8B 8.03B, Qwen3-8B 8.19B
    assert KNOWN_MODELS["Qwen/Qwen2.5-1.5B"].num_params / 1e9 == pytest.approx(1.54, abs=0.01)
    a = KNOWN_MODELS["Qwen/Qwen2.5-1.5B"]
    assert (a.num_params - a.embedding_params) / 1e9 == pytest.approx(1.31, abs=0.01)
    assert KNOWN_MODELS[LLAMA8].num_params / 1e9 == pytest.approx(8.03, abs=0.01)
    assert KNOWN_MODELS["Qwen/Qwen3-8B"].num_params / 1e9 == pytest.approx(8.19, abs=0.01)


def test_lora_params_match_unsloth_print():
    # facts §4.2 (2): Llama-3-8B r=16 all-linear → 41,943,040 trainable parameters (Unsloth's print)
    assert lora_params(KNOWN_MODELS[LLAMA8], 16, "all-linear") == 41_943_040
    # attention only: r·L·(4H + 2q + 2kv) = 16·32·(16384 + 8192 + 2048)
    assert lora_params(KNOWN_MODELS[LLAMA8], 16, ["q_proj", "k_proj", "v_proj", "o_proj"]) == 16 * 32 * 26624


# ---------------------------------------------------------------------------------------------------------------
# §4.3 (2): Unsloth's 20K-context accounting (row U-o), Llama-3.1-8B, 8 sequences of 20,000 tokens


def test_unsloth_20k_context_accounting():
    p = plan_memory(LLAMA8, num_generations=8, prompt_length=0, completion_length=19_999, cast_lm_head_to_fp32=True,
                    suggest=False)
    assert rel(p.logits_bytes_per_copy / 1e9, 78.3) <= 0.06  # fp32 logits 8·20000·128256·4 = 82.1 GB vs 78.3
    assert p.logits_bytes_per_copy == 8 * 20_000 * 128_256 * 4
    assert rel(checkpoint_bytes(p.inputs) / 1e9, 42) <= 0.05  # GC checkpoints 41.9 GB vs 42
    assert rel(20_000 * p.kv_bytes_per_token / 1e9, 2.5) <= 0.05  # one 20K sequence: 2.62 GB vs 2.5
    assert rel(weight_bytes(p.inputs.arch, "bfloat16") / 1e9, 16) <= 0.01  # bf16 inference weights 16.1 vs 16


# ---------------------------------------------------------------------------------------------------------------
# §4.3 (3): TRL full fine-tuning (row T-a, trl#3456): the model-to-model delta, 28.2 GiB measured


def _t_a(model):
    # TRL-0.17 era: fp32 weights + bf16 autocast, AdamW 16 B/param, GC off, B=4, T=3072, T_c=1024, full logits;
    # no fragmentation allowance or CUDA context: the facts' figures are allocated tensors
    return plan_memory(model, use_peft=False, weight_dtype="float32", bf16=True, gradient_checkpointing=False,
                       num_generations=4, prompt_length=2048, completion_length=1024, logprob_head="unfused",
                       fragmentation=1.0, cuda_context_gib=0, suggest=False)


def test_trl_full_finetune_delta_matches_measurement():
    small, big = _t_a("Qwen/Qwen3-0.6B"), _t_a("Qwen/Qwen3-1.7B")
    delta = (big.peak - small.peak) / GiB
    assert rel(delta, 28.2) <= 0.10  # facts: predicted +27.2 vs measured +28.2 GiB
    assert small.peak / GiB == pytest.approx(29, abs=1.5)  # the facts' estimator: 29 and 56 GiB allocated
    assert big.peak / GiB == pytest.approx(56, abs=1.5)
    # same logits term for both (vocab, not model size, dominates it: trl#3678): 2.9 GiB
    assert small.logprob_head == big.logprob_head
    assert small.logprob_head / GiB == pytest.approx(2.9, abs=0.05)


# ---------------------------------------------------------------------------------------------------------------
# §4.3 (4): activation slope (row S-a), Llama-2-7B QLoRA, GC on: 0.79 MB per extra token measured


def test_activation_slope_matches_measurement():
    def act(t):
        p = plan_memory("meta-llama/Llama-2-7b-hf", load_in_4bit=True, num_generations=1, prompt_length=0,
                        completion_length=t, suggest=False)
        return activation_bytes(p.inputs)

    slope = act(16_385) - act(16_384)
    assert slope == 262_144 + 153_600  # checkpoints 2·H·L = 262 KB + one-layer recompute 2·k_layer = 154 KB
    sft_logits = 14 * 32_000  # the SFT run's logits: bf16 + fp32 upcast/grad/log-softmax = 448 KB per token
    assert rel((slope + sft_logits) / 1e6, 0.79) <= 0.10  # 0.86 vs 0.79 MB/token (+9%)


# ---------------------------------------------------------------------------------------------------------------
# §4.4: the facts file's A100-40GB planning table (its estimator; LoRA r=32 all-linear, GC on, vLLM colocate)

TABLE = [  # model, NF4-dq, B, T_c, liger, train peak GiB, max u
    ("Qwen/Qwen2.5-1.5B", False, 8, 1024, False, 12.4, 0.69),
    ("Qwen/Qwen2.5-1.5B", False, 8, 1024, True, 8.3, 0.79),
    ("Qwen/Qwen2.5-3B", False, 8, 1024, False, 16.7, 0.58),
    ("Qwen/Qwen2.5-3B", False, 8, 1024, True, 13.1, 0.67),
    ("Qwen/Qwen2.5-3B", False, 8, 2048, False, 24.6, 0.38),
    ("Qwen/Qwen2.5-3B", False, 8, 2048, True, 15.4, 0.61),
    ("Qwen/Qwen2.5-7B", False, 4, 1024, False, 22.1, 0.44),
    ("Qwen/Qwen2.5-7B", True, 4, 1024, False, 12.8, 0.68),
    (LLAMA8, False, 4, 1024, False, 22.6, 0.43),
    (LLAMA8, True, 4, 1024, False, 12.6, 0.68),
    ("Qwen/Qwen3-8B", False, 4, 2048, True, 26.5, 0.33),
]


@pytest.mark.parametrize("model, nf4, b, tc, liger, train_gib, max_u", TABLE)
def test_planning_table(model, nf4, b, tc, liger, train_gib, max_u):
    p = plan_memory(model, lora_r=32, load_in_4bit=nf4, bnb_double_quant=nf4, num_generations=b, prompt_length=512,
                    completion_length=tc, use_liger_kernel=liger, logprob_head="liger" if liger else "unfused",
                    use_vllm=True, vllm_max_model_length=512 + tc, margin=0.0, suggest=False)
    train = (p.train_peak - p.vllm_resident_training) / GiB
    assert rel(train, train_gib) <= 0.15
    assert 1 - train * GiB / p.usable_bytes == pytest.approx(max_u, abs=0.05)


def test_sleep_mode_row():
    # §4.4: Qwen2.5-7B bf16 with sleep mode → u ≤ 0.58, KV 7.2 GiB
    p = plan_memory("Qwen/Qwen2.5-7B", lora_r=32, num_generations=4, prompt_length=512, completion_length=1024,
                    logprob_head="unfused", use_vllm=True, vllm_enable_sleep_mode=True, vllm_max_model_length=1536,
                    margin=0.0, suggest=False)
    u, best = largest_vllm_utilization(p.inputs)
    assert u == pytest.approx(0.58, abs=0.03)
    assert rel(best.vllm_kv_cache / GiB, 7.2) <= 0.15


# ---------------------------------------------------------------------------------------------------------------
# hand-checkable terms


def test_unfused_logits_term_is_b_t_v_bytes():
    # B=8, T_c=1024, V=151936, bf16 logits (2 B), c=2 copies + one fp32 row (T_c+1)·V·4
    p = plan_memory("Qwen/Qwen2.5-1.5B", num_generations=8, completion_length=1024, logprob_head="unfused",
                    suggest=False)
    assert p.logits_bytes_per_copy == 8 * 1025 * 151936 * 2
    assert p.logprob_head == 8 * 1025 * 151936 * 2 * 2 + 1025 * 151936 * 4
    # facts: 2·2·V = 0.61 MB per completion token (V = 152k), besides the one fp32 row
    assert (p.logprob_head - 1025 * 151936 * 4) / (8 * 1025) / 1e6 == pytest.approx(0.61, abs=0.01)


def test_trl_fused_head_term():
    # TRL 1.16 fused head, N = B·T_c = 8192 tokens: hidden copy + fp32 grad + cast N·H·(2+4+2), one 4096×32768 bf16
    # tile, nine fp32 per-token vectors; LoRA leaves lm_head frozen (no weight gradient)
    p = plan_memory("Qwen/Qwen2.5-1.5B", num_generations=8, completion_length=1024, suggest=False)
    n = 8 * 1024
    assert p.logprob_head == n * 1536 * 8 + 4096 * 32768 * 2 + 36 * n
    assert p.logprob_head < p.logits_bytes_per_copy / 6  # 0.34 GiB against 2.3 GiB for one copy of the logits


def test_breakdown_sums_to_the_training_peak():
    p = plan_memory("Qwen/Qwen2.5-1.5B", num_generations=8, use_vllm=True, vllm_max_model_length=1536,
                    vllm_gpu_memory_utilization=0.4, suggest=False)
    train_terms = (p.weights + p.adapter_optimizer + p.reference_model + p.cuda_context + p.vllm_budget
                   + max(p.activations + p.logprob_head, p.nograd_logprobs) + p.quant_transient + p.fragmentation)
    assert p.train_peak == train_terms
    assert p.vllm_budget == p.vllm_weights + p.vllm_overhead + p.vllm_kv_cache
    assert p.weights == 2 * KNOWN_MODELS["Qwen/Qwen2.5-1.5B"].num_params
    assert p.adapter_optimizer == 16 * lora_params(KNOWN_MODELS["Qwen/Qwen2.5-1.5B"], 16, "all-linear")


def test_gradient_checkpointing_formula():
    # GC on: 2·B·T·H·L + 2·B·T·k_layer; off: 2·B·T·L·k_layer; Llama-3.1-8B k_layer = 20.5·H
    on = plan_memory(LLAMA8, num_generations=2, prompt_length=100, completion_length=156, suggest=False)
    off = plan_memory(LLAMA8, num_generations=2, prompt_length=100, completion_length=156,
                      gradient_checkpointing=False, suggest=False)
    assert k_layer(on.inputs) == 20.5 * 4096
    assert on.activations == 2 * 2 * 256 * 4096 * 32 + 2 * 2 * 256 * 83968
    assert off.activations == 2 * 2 * 256 * 32 * 83968


def test_full_finetune_reference_model_with_beta():
    lora = plan_memory("Qwen/Qwen3-0.6B", beta=0.04, suggest=False)
    full = plan_memory("Qwen/Qwen3-0.6B", beta=0.04, use_peft=False, suggest=False)
    assert lora.reference_model == 0  # adapter disabled, no second copy
    assert full.reference_model == full.weights


# ---------------------------------------------------------------------------------------------------------------
# monotonicity and suggestions


def test_bigger_group_needs_more_memory():
    peaks = [plan_memory("Qwen/Qwen2.5-3B", num_generations=g, suggest=False).peak for g in (2, 4, 8, 16)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    kv = [plan_memory("Qwen/Qwen2.5-3B", num_generations=g, per_device_train_batch_size=16, use_vllm=True,
                      vllm_max_model_length=1536, suggest=False).concurrent_sequences for g in (2, 16)]
    assert kv[0] == kv[1]  # vLLM's KV cache does not depend on G; only the trainer's micro-batch does


def test_longer_completions_and_quantisation_move_the_peak_the_right_way():
    short = plan_memory("Qwen/Qwen2.5-7B", completion_length=512, suggest=False)
    long = plan_memory("Qwen/Qwen2.5-7B", completion_length=2048, suggest=False)
    qlora = plan_memory("Qwen/Qwen2.5-7B", completion_length=2048, load_in_4bit=True, suggest=False)
    assert short.peak < long.peak and qlora.peak < long.peak


def test_suggestions_are_replanned_and_fix_a_7b_colocate_run():
    p = plan_memory("Qwen/Qwen2.5-7B", lora_r=32, num_generations=8, use_vllm=True, vllm_gpu_memory_utilization=0.5)
    assert p.verdict == "does not fit"
    assert any("vllm_max_model_length" in x for x in p.problems)  # the 131,072-token default context
    fixes = [s for s in p.suggestions if s.fits]
    assert fixes
    for s in fixes:  # each fix, re-planned independently, fits
        again = plan_memory("Qwen/Qwen2.5-7B", lora_r=32, num_generations=8, use_vllm=True, suggest=False,
                            **{"vllm_gpu_memory_utilization": 0.5, **s.changes})
        assert again.verdict == "fits" and again.peak == s.peak
    assert any("load_in_4bit" in s.changes for s in fixes)
    assert any(s.changes.get("vllm_enable_sleep_mode") for s in fixes)


def test_largest_utilisation_is_the_boundary():
    p = plan_memory("Qwen/Qwen2.5-1.5B", num_generations=8, use_vllm=True, vllm_max_model_length=1536,
                    suggest=False)
    u, best = largest_vllm_utilization(p.inputs)
    assert best.verdict == "fits"
    over = plan_memory("Qwen/Qwen2.5-1.5B", num_generations=8, use_vllm=True, vllm_max_model_length=1536,
                       vllm_gpu_memory_utilization=round(u + 0.01, 2), suggest=False)
    assert over.verdict != "fits"


def test_smaller_micro_batch_suggestion_keeps_the_batches():
    p = plan_memory("Qwen/Qwen2.5-7B", num_generations=16, completion_length=4096, gradient_checkpointing=False)
    batch = [s for s in p.suggestions if "per_device_train_batch_size" in s.changes and len(s.changes) == 3]
    assert batch
    ch = batch[0].changes
    assert ch["per_device_train_batch_size"] * ch["gradient_accumulation_steps"] == 16
    assert ch["per_device_train_batch_size"] * ch["steps_per_generation"] == 16


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_unknown_model_names_the_fix():
    with pytest.raises(ValueError, match="config.json") as e:
        plan_memory("acme/NotAModel-3B")
    assert "acme/NotAModel-3B" in str(e.value) and "local model folder" in str(e.value)


@pytest.mark.parametrize("kwargs", [
    {"completion_length": -1}, {"prompt_length": -5}, {"num_generations": 0}, {"per_device_train_batch_size": -2},
    {"lora_r": 0}, {"gpu_memory_gib": -40}, {"use_vllm": True, "vllm_gpu_memory_utilization": 1.5},
    {"logps_chunk_size": 0}, {"num_generations": 8, "per_device_train_batch_size": 3},
    {"lora_target_modules": ["mlp"]}, {"weight_dtype": "int3"}, {"logprob_head": "magic"},
])
def test_bad_sizes_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        plan_memory("Qwen/Qwen2.5-0.5B", **kwargs)


def test_full_finetune_of_a_4bit_base_is_refused():
    with pytest.raises(ValueError, match="use_peft=True"):
        plan_memory("Qwen/Qwen2.5-0.5B", use_peft=False, load_in_4bit=True)


# ---------------------------------------------------------------------------------------------------------------
# config.json / folder input


def test_config_json_path_and_folder(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
           "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True,
           "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from_path = plan_memory(str(tmp_path / "config.json"), suggest=False)
    from_dir = plan_memory(tmp_path, suggest=False)
    shipped = plan_memory("Qwen/Qwen2.5-Math-1.5B", suggest=False)
    assert from_path.peak == from_dir.peak == shipped.peak
    assert from_path.inputs.arch.num_params == shipped.inputs.arch.num_params


def test_moe_config_and_folder_without_config_are_refused(tmp_path):
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps({"hidden_size": 8, "num_experts": 4}))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        plan_memory(tmp_path / "moe")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        plan_memory(tmp_path / "empty")


def test_shipped_tiny_model_folder():
    from trl_groupx.toy import tiny_model_path

    p = plan_memory(tiny_model_path(), num_generations=4, prompt_length=16, completion_length=16)
    assert p.fits and p.inputs.arch.vocab_size == 104


# ---------------------------------------------------------------------------------------------------------------
# plan_from_config and the CLI


def test_plan_from_config(tmp_path):
    from trl import ModelConfig

    from trl_groupx import GRPOConfig
    from trl_groupx.memory import plan_from_config

    cfg = GRPOConfig(output_dir=str(tmp_path), num_generations=8, per_device_train_batch_size=8,
                     gradient_accumulation_steps=2, max_completion_length=1024, use_vllm=True,
                     vllm_gpu_memory_utilization=0.4, vllm_max_model_length=1536, use_cpu=True, report_to=[])
    margs = ModelConfig(model_name_or_path="Qwen/Qwen2.5-1.5B", use_peft=True, lora_r=32,
                        lora_target_modules=["all-linear"], lora_dropout=0.0, dtype="bfloat16")
    p = plan_from_config(cfg, margs)
    direct = plan_memory("Qwen/Qwen2.5-1.5B", lora_r=32, num_generations=8, gradient_accumulation_steps=2,
                         prompt_length=512, completion_length=1024, use_vllm=True, vllm_gpu_memory_utilization=0.4,
                         vllm_max_model_length=1536, bf16=bool(cfg.bf16), suggest=False)
    assert p.peak == direct.peak
    assert p.inputs.prompt_length == 512  # vllm_max_model_length − max_completion_length
    q = plan_from_config(cfg, ModelConfig(model_name_or_path="Qwen/Qwen2.5-1.5B", use_peft=True, lora_r=32,
                                          load_in_4bit=True, dtype="bfloat16"))
    assert q.weights < p.weights


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trl_groupx.cli", *args], capture_output=True, text=True, check=False,
                          timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_cli_plan_prints_the_verdict(capsys):
    from trl_groupx.cli import main

    main(["plan", "--model", "Qwen/Qwen2.5-1.5B", "--num_generations", "8", "--use_vllm",
          "--vllm_max_model_length", "1536"])
    out = capsys.readouterr().out
    assert "VERDICT: fits" in out and "policy weights" in out and "vLLM KV cache" in out
    assert "largest vllm_gpu_memory_utilization" in out
    main(["plan", "--model", "Qwen/Qwen2.5-7B", "--use_vllm", "--vllm_gpu_memory_utilization", "0.6"])
    out = capsys.readouterr().out
    assert "VERDICT: does not fit" in out and "[ fits]" in out


def test_cli_plan_errors_and_json(capsys):
    from trl_groupx.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--model", "acme/NotAModel-3B"])
    assert "config.json" in capsys.readouterr().err
    main(["plan", "--model", "Qwen/Qwen3-0.6B", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "fits" and data["model"] == "Qwen/Qwen3-0.6B"


def test_grpo_recipe_plan_answers_without_training(tmp_path):
    # a subprocess, so that nothing trains, downloads or writes: the plan is printed and the command exits
    r = _cli("grpo", "--config", "recipes/gmpo.yaml", "--plan", "--output_dir", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Memory plan: Qwen/Qwen2.5-Math-1.5B" in r.stdout and "VERDICT" in r.stdout
    assert "LoRA r=64" in r.stdout and "x4 accumulation" in r.stdout
    assert not (tmp_path / "out").exists()


def test_cli_lists_the_shipped_models(capsys):
    from trl_groupx.cli import main

    main(["plan", "--list_models"])
    out = capsys.readouterr().out.split()
    for name in ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "meta-llama/Llama-3.2-1B",
                 "meta-llama/Llama-3.2-3B", LLAMA8):
        assert name in out
    assert plan_memory("qwen2.5-1.5b", suggest=False).inputs.arch.name == "Qwen/Qwen2.5-1.5B"  # short, any case
