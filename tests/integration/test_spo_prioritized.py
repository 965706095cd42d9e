"""rollout_filter="spo_prioritized" on the tiny model: batch 2's prompts are drawn ∝ √(p̂(1−p̂)) + 0.05 from the
spo_single tracker after batch 1; the dataset keys equal the advantage stage's keys; resume continues exactly."""

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.sampling.spo_prioritized import dataset_prompt_keys, spo_priority_draw
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

G = 4  # conftest: num_generations=4, per_device_train_batch_size=8 → 2 prompts per generation batch


class RecordingReward:
    __name__ = "parity_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = parity_reward(completions)
        self.calls.append(([p[-1]["content"] for p in prompts], rewards))
        return rewards


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _weights(p_hat):
    return (p_hat * (1 - p_hat)).sqrt() + 0.05


@pytest.mark.parametrize("peft", [False, True])
def test_batches_follow_the_tracker(tmp_path, peft):
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    reward = RecordingReward()
    trainer = ours(tmp_path, peft, rollout_filter="spo_prioritized", advantage_estimator="spo_single",
                   dataset=data, max_steps=2, reward_funcs=[reward])
    keys = dataset_prompt_keys(trainer, data)
    # a hand-made tracker before training: prompts 0-5 almost surely solved (α = 1000, β = 1e-6: p̂ ≈ 1, weight
    # ≈ .05), prompts 6 and 7 never seen (p̂ = .5, weight .55)
    alpha0, beta0 = 1000.0, 1e-6
    order = torch.argsort(keys[:6])
    trainer.variant_state["spo_single"].update(
        keys=keys[:6][order], values=torch.tensor([[alpha0, beta0]] * 6, dtype=torch.float64))
    trainer.train()
    p_hat = torch.tensor([alpha0 / (alpha0 + beta0)] * 6 + [0.5, 0.5], dtype=torch.float64)
    first = spo_priority_draw(_weights(p_hat), 2, seed=0, draw=0)
    assert reward.calls[0][0] == [texts[i] for i in first for _ in range(G)]
    uniform = torch.full((8,), 0.55, dtype=torch.float64)
    assert first != spo_priority_draw(uniform, 2, seed=0, draw=0)  # without the tracker: other prompts
    # tracker after batch 1 (spo_single defaults: constant ρ = 0.875), prompt x with s_x successes of 4:
    #   seen before: α = .875·1000 + s_x, β = .875·1e-6 + 4 − s_x; unseen: α = .4375 + s_x, β = .4375 + 4 − s_x
    rewards = torch.tensor(reward.calls[0][1], dtype=torch.float64).view(2, G)
    for j, x in enumerate(first):
        s = rewards[j].sum()
        a, b = (0.875 * alpha0, 0.875 * beta0) if x < 6 else (0.4375, 0.4375)
        p_hat[x] = (a + s) / (a + b + G)
    second = spo_priority_draw(_weights(p_hat), 2, seed=0, draw=1)
    assert reward.calls[1][0] == [texts[i] for i in second for _ in range(G)]
    # the advantage stage hashed the batches' prompts to the dataset keys computed here: it updated the hand-made
    # entries and added only the newly visited prompts
    tracker = trainer.variant_state["spo_single"]
    assert set(tracker["keys"].tolist()) == set(keys[:6].tolist()) | {keys[i].item() for i in first + second}
    assert torch.equal(trainer.variant_state["spo_prioritized"]["dataset_keys"], keys)
    assert trainer.variant_state["spo_prioritized"]["draws"] == 2


def test_gradient_differs_from_plain_spo_single_and_composes_with_gmpo(tmp_path):
    data = arithmetic_dataset(8, seed=0)
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", advantage_estimator="spo_single", dataset=data))
    _, grads, inputs = one_step(ours(tmp_path / "spo", rollout_filter="spo_prioritized",
                                     advantage_estimator="spo_single", dataset=data))
    assert not torch.equal(inputs["prompt_ids"], base_inputs["prompt_ids"])  # other prompts than TRL's sampler
    assert grads_differ(base_grads, grads)
    trainer = ours(tmp_path / "gmpo", rollout_filter="spo_prioritized", advantage_estimator="spo_single",
                   loss_type="gmpo", dataset=data)
    _, gmpo_grads, _ = one_step(trainer)
    assert all(torch.isfinite(g).all() for g in gmpo_grads.values()) and grads_differ(grads, gmpo_grads)
    assert trainer.variant_state["spo_prioritized"]["draws"] == 1


def test_resume_continues_exactly(tmp_path):
    data = arithmetic_dataset(8, seed=0)

    def run(path, resume=None):
        reward = RecordingReward()
        trainer = ours(path, rollout_filter="spo_prioritized", advantage_estimator="spo_single", dataset=data,
                       max_steps=3, save_strategy="steps", save_steps=1, reward_funcs=[reward])
        trainer.train(resume_from_checkpoint=resume)
        return trainer, reward

    full, full_reward = run(tmp_path / "full")
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert saved["spo_prioritized"]["draws"] == 2
    resumed, resumed_reward = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed_reward.calls == full_reward.calls[-1:]  # step 3: same prompts, same completions' rewards
    assert resumed.variant_state["spo_prioritized"]["draws"] == full.variant_state["spo_prioritized"]["draws"] == 3
    for key in ("keys", "values"):
        assert torch.equal(resumed.variant_state["spo_single"][key], full.variant_state["spo_single"][key])
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_get_the_same_prompts_in_the_same_order(tmp_path):
    launch(Path(__file__).with_name("spo_prioritized_mp_worker.py"), tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree_on_selection"] and result["ranks_agree_on_state"], result
        assert result["local_rows_are_my_slice"], result
    assert results[0]["selections"] == results[1]["selections"] and len(results[0]["selections"]) == 2
