"""SOUP (rollout_filter="soup") on the tiny model: at a prompt's second visit, the last rollout of its group starts
with the stored prefix of the first rollout of its previous visit, continues on-policy in the batch's own generate
call, is scored with the batch, and trains with the stored log-probs on the prefix and the current policy's on the
continuation; f = 0 trains exactly as GRPO; the gradient changes against GRPO, full and LoRA; compositions with an
objective, an advantage estimator and a KL term. Resume: the stateful contract (test_stateful_contract.py); two processes: soup_mp_worker.py."""

import copy
import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.toy import arithmetic_dataset

G = 4  # conftest: per_device_train_batch_size 8 → two groups per generation batch, one per prompt of the dataset


def _trainer(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         dataset=arithmetic_dataset(2, seed=0), shuffle_dataset=False, **flags)


def _recording(trainer):
    """Wrap the generation step: per batch, the prefix buffer before it, the output, and the global rewards."""
    batches = []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        before = copy.deepcopy(trainer.variant_state.get("soup", {}))
        output = generate(inputs)
        batches.append({"buffer": before, "output": {k: v.clone() if torch.is_tensor(v) else v
                                                      for k, v in output.items()},
                        "rewards": trainer._rewards_per_func.clone(),
                        "current": trainer._rollout_logps(output, trainer.model, compute_entropy=False)[0]})
        return output

    trainer._generate_and_score_completions = recording
    return batches


def test_second_visit_mixes_the_stored_prefix(tmp_path):
    trainer = _trainer(tmp_path, rollout_filter="soup", max_steps=2)
    batches = _recording(trainer)
    trainer.train()
    first, second = batches
    assert first["buffer"] == {} and second["buffer"]["prompts"]  # stored at the first visit, mixed at the second
    tokenizer = trainer.processing_class
    out = second["output"]
    for group in range(2):
        assert out["prompt_ids"][group * G].equal(first["output"]["prompt_ids"][group * G])  # same prompt order
        # the stored prefix of this group's prompt: first ⌊0.5·n⌋ tokens of the first visit's slot-0 rollout
        first_row = first["output"]["completion_ids"][group * G]
        n = int(first["output"]["completion_mask"][group * G].sum())
        n_before_eos = n - int(int(first_row[n - 1]) in trainer.eos_token_ids)
        m = n_before_eos // 2
        prefix = first_row[:m]
        row = group * G + G - 1  # the mixed slot
        assert out["completion_ids"][row, :m].equal(prefix)
        # behaviour log-probs: the first visit's on the prefix, the generating policy's on the continuation
        length = int(out["completion_mask"][row].sum())
        first_logps = first["current"][group * G, :m]
        assert torch.allclose(out["old_per_token_logps"][row, :m], first_logps, atol=1e-6)
        assert torch.allclose(out["old_per_token_logps"][row, m:length], second["current"][row, m:length], atol=1e-6)
        if m:  # the prefix was sampled by an earlier policy: its log-probs differ from the current ones
            assert not torch.allclose(out["old_per_token_logps"][row, :m], second["current"][row, :m], atol=1e-7)
        # the other rows keep ratio 1: behaviour = current policy
        other = group * G
        n_other = int(out["completion_mask"][other].sum())
        assert torch.allclose(out["old_per_token_logps"][other, :n_other], second["current"][other, :n_other],
                              atol=1e-6)
        # re-scored: the global rewards hold the mixed completion's reward
        text = tokenizer.decode(out["completion_ids"][row, :length], skip_special_tokens=True)
        assert second["rewards"][row, 0].item() == parity_reward([[{"content": text}]])[0]
    assert out["num_items_in_batch"] == out["completion_mask"].sum()
    logs = [h["groupx/soup_mixed_rows"] for h in trainer.state.log_history if "groupx/soup_mixed_rows" in h]
    assert logs == [0.0, 2.0]


def test_fraction_zero_trains_exactly_as_grpo(tmp_path):
    plain = _trainer(tmp_path / "grpo", max_steps=3)
    plain.train()
    zero = _trainer(tmp_path / "soup", rollout_filter="soup", soup_prefix_fraction=0.0, max_steps=3)
    zero.train()
    assert_same_weights(plain, zero)
    assert zero.variant_state["soup"] == {}  # nothing stored, nothing mixed


def _second_step(trainer):
    one_step(trainer, seed=0)  # first visit: stores the prefixes
    return one_step(trainer, seed=1)


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_grpo(tmp_path, peft):
    _, base, _ = _second_step(_trainer(tmp_path / "grpo", peft=peft))
    trainer = _trainer(tmp_path / "soup", peft=peft, rollout_filter="soup", soup_mixed_rollouts=2)
    _, grads, inputs = _second_step(trainer)
    assert "old_per_token_logps" in inputs  # the mixed rows carry their behaviour log-probs
    assert grads_differ(base, grads)


@pytest.mark.parametrize("flags", [{"loss_type": "cispo"}, {"advantage_estimator": "rloo"}, {"beta": 0.1}],
                         ids=["cispo", "rloo", "kl"])
def test_composes(tmp_path, flags):
    _, alone, _ = _second_step(_trainer(tmp_path / "soup", rollout_filter="soup"))
    trainer = _trainer(tmp_path / "pair", rollout_filter="soup", **flags)
    _, grads, inputs = _second_step(trainer)
    assert all(torch.isfinite(g).all() for g in grads.values())
    if "beta" not in flags:
        assert grads_differ(alone, grads)
    else:  # π_θ = π_ref before any update, so the KL term adds no gradient; but the mixed rows' reference
        # log-probs must be those of their new tokens, i.e. equal the policy's on every row
        mask = inputs["completion_mask"].bool()
        current = trainer._rollout_logps(inputs, trainer.model, compute_entropy=False)[0]
        assert torch.allclose(inputs["ref_per_token_logps"][mask], current[mask], atol=1e-5)


@pytest.mark.parametrize("layout", [{"steps_per_generation": 2, "gradient_accumulation_steps": 2},
                                    {"num_iterations": 2}], ids=["two_micro_batches", "two_iterations"])
def test_mixes_with_several_updates_per_generation_batch(tmp_path, layout):
    # four prompts: 16 rows per generation batch with two micro-batches, every prompt revisited from the second batch
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, rollout_filter="soup",
                            dataset=arithmetic_dataset(4 if "steps_per_generation" in layout else 2, seed=0),
                            shuffle_dataset=False, max_steps=4, **layout)
    trainer.train()
    mixed = [h["groupx/soup_mixed_rows"] for h in trainer.state.log_history if "groupx/soup_mixed_rows" in h]
    assert mixed[0] == 0 and sum(mixed) > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_resume_mixes_the_checkpointed_prefixes_exactly(tmp_path):
    def run(path, resume=None):
        trainer = _trainer(path, rollout_filter="soup", max_steps=3, save_strategy="steps", save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    mixed = [h["groupx/soup_mixed_rows"] for h in resumed.state.log_history if "groupx/soup_mixed_rows" in h]
    assert mixed[-1] > 0  # the resumed step mixed prefixes restored from the checkpoint
    a, b = full.variant_state["soup"]["prompts"], resumed.variant_state["soup"]["prompts"]
    assert a.keys() == b.keys() and all(
        all(torch.equal(x, y) for x, y in zip(a[k][f], b[k][f], strict=True)) for k in a for f in ("ids", "logps"))
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_agree(tmp_path):
    launch(Path(__file__).with_name("soup_mp_worker.py"), tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["states_agree"] and result["params_agree"] and result["finite"], result
        assert result["mixed"] == result["expected"] and sum(result["expected"]) >= 1, result
        assert result["expected"][0] == 0 and result["prefix_kept"], result
