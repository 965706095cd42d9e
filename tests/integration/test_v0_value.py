"""V₀ prompt selection (rollout_filter="v0_value") on the tiny model: each generation batch's prompts are the ones a
registered value model finds informative given the run's context of earlier (prompt, success rate) pairs; the
gradient changes against plain GRPO (other prompts); full and LoRA; composition with an objective; missing
predictor refused at construction; two processes select the same prompts (`v0_value_mp_worker.py`). Exact resume
is checked by `test_stateful_contract.py`."""

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.sampling import v0_value as v0_module
from trl_groupx.toy import arithmetic_dataset

G = 4  # conftest: num_generations=4, per_device_train_batch_size=8 → 2 prompts per generation batch
# hand-built predictions for the 8 prompts: p(1−p) = [0, .16, .25, 0, .2475, .09, .21, .0475]
TABLE = [0.0, 0.2, 0.5, 1.0, 0.45, 0.9, 0.3, 0.05]


class RecordingReward:
    """parity_reward, recording each call's prompts (one per rollout) and rewards."""

    __name__ = "parity_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = parity_reward(completions)
        self.calls.append(([p[-1]["content"] for p in prompts], rewards))
        return rewards


class TablePredictor:
    """`TABLE[i]` for prompt i, but 1.0 (certain: skipped) for a prompt already in the context."""

    def __init__(self, texts):
        self.texts, self.calls = texts, []

    def predict(self, context_prompts, context_labels, target_prompts):
        self.calls.append((list(context_prompts), list(context_labels)))
        return [1.0 if t in context_prompts else TABLE[self.texts.index(t)] for t in target_prompts]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.fixture
def predictors(monkeypatch):
    monkeypatch.setattr(v0_module, "_PREDICTORS", dict(v0_module._PREDICTORS))


@pytest.mark.parametrize("peft", [False, True])
def test_selected_prompts_follow_the_predictor_and_the_context(tmp_path, peft, predictors):
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    model = TablePredictor(texts)
    v0_module.register_value_predictor("table", model)
    reward = RecordingReward()
    trainer = ours(tmp_path, peft, rollout_filter="v0_value", v0_value_predictor="table", dataset=data, max_steps=2,
                   reward_funcs=[reward])
    trainer.train()
    # batch 1, empty context: the two largest p(1−p) among eligible prompts are 2 (.25) and 4 (.2475)
    assert model.calls[0] == ([], [])
    assert reward.calls[0][0] == [texts[i] for i in (2, 4) for _ in range(G)]
    # batch 2: the context holds batch 1's success rates (parity reward 1 ≥ threshold 1), prompts 2, 4 become
    # certain (1.0, skipped), so 6 (.21) and 1 (.16) follow
    rates = torch.tensor(reward.calls[0][1]).view(2, G).mean(1).tolist()
    assert model.calls[1] == ([texts[2], texts[4]], rates)
    assert reward.calls[1][0] == [texts[i] for i in (6, 1) for _ in range(G)]
    state = trainer.variant_state["v0_value"]
    assert state["context_index"].tolist() == [2, 4, 6, 1] and state["draws"] == 2
    expected = rates + torch.tensor(reward.calls[1][1]).view(2, G).mean(1).tolist()
    torch.testing.assert_close(state["context_rate"], torch.tensor(expected, dtype=torch.float64))


def test_gradient_differs_from_plain_grpo_and_composes_with_gmpo(tmp_path, predictors):
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    v0_module.register_value_predictor("table", TablePredictor(texts))
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", dataset=data))
    _, grads, inputs = one_step(ours(tmp_path / "v0", rollout_filter="v0_value", v0_value_predictor="table",
                                     dataset=data))
    assert not torch.equal(inputs["prompt_ids"], base_inputs["prompt_ids"])  # prompts 2, 4 instead of TRL's
    assert grads_differ(base_grads, grads)
    trainer = ours(tmp_path / "gmpo", rollout_filter="v0_value", loss_type="gmpo", dataset=data)  # built-in knn
    _, gmpo_grads, _ = one_step(trainer)
    assert all(torch.isfinite(g).all() for g in gmpo_grads.values()) and grads_differ(grads, gmpo_grads)
    state = trainer.variant_state["v0_value"]
    assert state["draws"] == 1 and state["context_index"].numel() == 2  # knn, empty context: all 0.5 → prompts 0, 1
    assert state["context_index"].tolist() == [0, 1]


def test_missing_predictor_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="v0_value_predictor='my_v0'.*register_value_predictor"):
        ours(tmp_path, rollout_filter="v0_value", v0_value_predictor="my_v0")


@needs_torchrun
def test_two_processes_select_the_same_prompts(tmp_path):
    launch(Path(__file__).with_name("v0_value_mp_worker.py"), tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree_on_selection"] and result["ranks_agree_on_state"], result
        assert result["local_rows_are_my_slice"] and result["matches_replay"], result
    assert results[0]["selections"] == results[1]["selections"] == [[2, 4], [6, 1]]
