"""`generation_micro_group_size` on the shipped tiny Llama: greedy completions equal one unchunked `generate()`
call for every chunk size, `generate()` never sees more than k sequences, and a sampled GRPO step trains (full,
LoRA, and together with `prefix_grouper` and another advantage estimator) with every row's prompt in place."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_trainer, one_step
from trl_groupx import GRPOConfig, GRPOTrainer

GREEDY = {"do_sample": False}


def _spy_generate_batches(trainer) -> list[int]:
    """Record the batch size of every `model.generate` call (the call whose KV cache and logits we bound)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    sizes: list[int] = []
    original = model.generate

    def generate(*args, **kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    model.generate = generate
    return sizes


@pytest.fixture(scope="module")
def greedy_trainer(tmp_path_factory):
    return build_trainer(GRPOTrainer, GRPOConfig, tmp_path_factory.mktemp("mg"), generation_kwargs=GREEDY,
                         per_device_train_batch_size=12, num_generations=4, max_completion_length=8)


def test_greedy_completions_equal_unchunked(greedy_trainer):
    t = greedy_trainer
    prompts = [t.train_dataset[i]["prompt"] for i in range(12)]
    prompt_ids, images, fields = t._tokenize_prompts(prompts)
    assert len({len(p) for p in prompt_ids}) > 1  # chunks are left-padded differently from the full batch
    sizes = _spy_generate_batches(t)
    t.args.generation_micro_group_size = None
    reference, _ = t._generate_single_turn(prompt_ids, images, fields, 4)
    assert sizes == [12]
    assert any(len(c) > 1 for c in reference)  # real completions, not only an immediate EOS
    for k, expected_calls in [(1, [1] * 12), (3, [3] * 4), (5, [5, 5, 2]), (12, [12]), (40, [12])]:
        sizes.clear()
        t.args.generation_micro_group_size = k
        completions, logprobs = t._generate_single_turn(prompt_ids, images, fields, 4)
        assert sizes == expected_calls, k
        assert completions == reference, k
        assert logprobs is None
    t.args.generation_micro_group_size = None


def test_greedy_generation_batch_equals_unchunked(greedy_trainer):
    """Through TRL's whole generate-and-score path: same prompt/completion tensors and rewards with k = 3."""
    t = greedy_trainer
    batch = [t.train_dataset[i] for i in range(12)]
    t.args.generation_micro_group_size = None
    reference = t._generate_and_score_completions(batch)
    t.args.generation_micro_group_size = 5
    chunked = t._generate_and_score_completions(batch)
    t.args.generation_micro_group_size = None
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"):
        assert torch.equal(chunked[key], reference[key]), key


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_sampled_step_trains_with_rows_in_place(tmp_path, peft):
    t = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, peft=peft, generation_micro_group_size=3)
    sizes = _spy_generate_batches(t)
    loss, grads, inputs = one_step(t)
    assert sizes == [3, 3, 2]  # 8 rows per device, k = 3 does not divide it
    assert torch.isfinite(loss)
    assert grads and any(g.abs().sum() > 0 for g in grads.values())
    # every row keeps its own prompt: each prompt occurs exactly num_generations times, as TRL's sampler repeats it
    prompts = t.processing_class.batch_decode(inputs["prompt_ids"], skip_special_tokens=True)
    assert len(prompts) == 8 and all(prompts.count(p) == 4 for p in prompts)
    assert inputs["completion_ids"].shape[0] == 8


def test_generation_rows_keep_their_prompts(tmp_path):
    """Before TRL shuffles for the optimizer: row r of the output is row r of the sampled batch."""
    t = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, generation_micro_group_size=3)
    batch = [t.train_dataset[i // 4] for i in range(8)]  # two prompts, each repeated G = 4 times, as the sampler does
    out = t._generate_and_score_completions(batch)
    expected, _, _ = t._tokenize_prompts([row["prompt"] for row in batch])
    for r, ids in enumerate(expected):
        row = out["prompt_ids"][r][out["prompt_mask"][r].bool()].tolist()
        assert row == ids, r


def test_composes_with_prefix_grouper_and_rloo(tmp_path):
    t = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, peft=True, generation_micro_group_size=4,
                      prefix_grouper=True, advantage_estimator="rloo")
    sizes = _spy_generate_batches(t)
    loss, grads, _ = one_step(t)
    assert sizes == [4, 4]
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())


def test_benchmark_smoke(tmp_path):
    """`benchmarks/micro_groups.py` keeps working (tiny sizes, in-process; no memory figure is asserted)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "micro_groups.py"
    spec = importlib.util.spec_from_file_location("micro_groups_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "mg.md"
    rows = bench.main(["--rows", "16", "--prompt-len", "8", "--completion-len", "3", "--hidden", "64", "--vocab",
                       "500", "--sizes", "4", "--in-process", "--output", str(out)])
    assert [r["case"] for r in rows] == ["trl", "k=4"]
    assert rows[0]["completions"] == rows[1]["completions"] and rows[0]["tokens"] == 16 * 3
    assert "identical to plain TRL in every case (greedy): yes" in out.read_text()


def test_train_loop_with_gradient_checkpointing_and_lora(tmp_path):
    """`Trainer.train()` for two optimizer steps, each on a buffered generation batch of 8 rows cut into two
    micro-batches (steps_per_generation = 2): each chunk enters and leaves TRL's generation context (gradient
    checkpointing off, then on again)."""
    t = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, peft=True, generation_micro_group_size=3,
                      gradient_checkpointing=True, max_steps=2, steps_per_generation=2, gradient_accumulation_steps=2,
                      per_device_train_batch_size=4)
    sizes = _spy_generate_batches(t)
    t.train()
    assert sizes == [3, 3, 2] * 2  # per optimizer step, one generation batch of 4 x 2 rows
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(float(x))) for x in losses)
