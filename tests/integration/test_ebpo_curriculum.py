"""EBPO's clustered sampling (rollout_filter="ebpo_curriculum") on the tiny model: the profiling pass measures each
prompt's pass rate under the initial policy before the first training batch, and training batches then follow the
easy → hard order with nothing filtered; topic clusters from a dataset column; the gradient changes against plain
GRPO, full and LoRA; the paper's pairing with advantage_estimator="ebpo"; resume continues exactly without profiling
again; two processes profile their shards and agree (ebpo_curriculum_mp_worker.py)."""

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from tests.integration.test_sgpo import SUCCESSES, ScriptedReward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

G = 4  # conftest: per_device_train_batch_size 8 → two prompts per generation batch
# pass rates from ScriptedReward with 4 profiling samples: [1, .25, .75, 0, .5, 1, 0, .75]; easy → hard, ties in
# dataset order, nothing dropped: 0, 5 (1.0), 2, 7 (.75), 4 (.5), 1 (.25), 3, 6 (0)
STREAM = [0, 5, 2, 7, 4, 1, 3, 6]


def _data():
    data = arithmetic_dataset(8, seed=0)
    return data, [row["prompt"][-1]["content"] for row in data]


def ours(tmp_path, reward, data, peft=False, **flags):
    flags = {"rollout_filter": "ebpo_curriculum", "ebpo_curriculum_samples": 4, **flags}
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, dataset=data,
                         reward_funcs=[reward], **flags)


def _prompts(call):
    return [call[i] for i in range(0, len(call), G)]


def test_profiling_then_easy_to_hard_batches(tmp_path):
    data, texts = _data()
    reward = ScriptedReward(texts)
    trainer = ours(tmp_path, reward, data, max_steps=3)
    trainer.train()
    # profiling: 8 rows per generate call = 2 prompts × 4 samples, in prompt order, before any training batch
    assert reward.calls[:4] == [[x] * 4 + [x + 1] * 4 for x in (0, 2, 4, 6)]
    state = trainer.variant_state["ebpo_curriculum"]
    assert state["pass_rate"].tolist() == [s / 4 for s in SUCCESSES]
    assert state["order"].tolist() == STREAM and state["served"] == 6
    assert [_prompts(call) for call in reward.calls[4:]] == [[0, 5], [2, 7], [4, 1]]  # trivial prompts are kept


def test_topic_clusters_from_a_column(tmp_path):
    data, texts = _data()
    topics = ["b", "a", "b", "a", "c", "c", "a", "b"]
    reward = ScriptedReward(texts)
    trainer = ours(tmp_path, reward, data.add_column("topic", topics), max_steps=4,
                   ebpo_curriculum_mode="topic", ebpo_curriculum_topic_column="topic")
    trainer.train()
    served = [p for call in reward.calls for p in _prompts(call)]  # no profiling call in topic mode
    assert sorted(served) == list(range(8)) and served == trainer.variant_state["ebpo_curriculum"]["order"].tolist()
    labels = [topics[i] for i in served]
    assert [label for k, label in enumerate(labels) if k == 0 or labels[k - 1] != label] == sorted(set(labels),
                                                                                                     key=labels.index)


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_plain_grpo(tmp_path, peft):
    data, texts = _data()
    _, base_grads, base_inputs = one_step(build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig,
                                                        tmp_path / "base", peft=peft, dataset=data,
                                                        reward_funcs=[ScriptedReward(texts)]))
    reward = ScriptedReward(texts)
    _, grads, inputs = one_step(ours(tmp_path / "ebpo", reward, data, peft=peft))
    assert [_prompts(call) for call in reward.calls[4:]] == [[0, 5]]  # the stream's first batch
    assert not torch.equal(inputs["prompt_ids"], base_inputs["prompt_ids"])
    assert grads_differ(base_grads, grads)


def test_pairs_with_ebpo_advantages(tmp_path):
    data, texts = _data()
    # second batch of the stream (2, 7: pass rates .75): mixed groups; EBPO's shrinkage baseline changes them
    def two_steps(path, **flags):
        trainer = ours(path, ScriptedReward(texts), data, **flags)
        one_step(trainer, seed=0)
        return one_step(trainer, seed=1)

    _, grpo, _ = two_steps(tmp_path / "grpo")
    _, ebpo, _ = two_steps(tmp_path / "ebpo", advantage_estimator="ebpo")
    assert all(torch.isfinite(g).all() for g in ebpo.values()) and grads_differ(grpo, ebpo)


def test_resume_continues_exactly_without_profiling_again(tmp_path):
    data, texts = _data()

    def run(path, resume=None):
        reward = ScriptedReward(texts)
        trainer = ours(path, reward, data, max_steps=3, save_strategy="steps", save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, reward

    full, full_reward = run(tmp_path / "full")
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)["ebpo_curriculum"]
    assert saved["order"].tolist() == STREAM and saved["served"] == 4
    resumed, resumed_reward = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed_reward.calls == full_reward.calls[-1:]  # no profiling calls; step 3's prompts: 4, then 1
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_profile_their_shards_and_agree(tmp_path):
    launch(Path(__file__).with_name("ebpo_curriculum_mp_worker.py"), tmp_path, timeout=600)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.jsonl").read_text())
        assert result["ranks_agree"] and result["pass_rate_is_scripted"] and result["order_is_stream"], result
        assert result["profiled_own_shard"] and result["trained_own_slice"], result
