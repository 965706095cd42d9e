"""sGPO (rollout_filter="sgpo") on the tiny model: the profiling pass generates `sgpo_profile_samples` completions
per prompt and scores them with the run's reward before the first training batch; training batches then follow
the curriculum (trivial prompts dropped, easy → hard); the gradient changes against plain GRPO (other prompts),
full and LoRA; composition with an objective; a resumed run continues exactly without re-profiling; two processes
profile their own shards and agree (`sgpo_mp_worker.py`). The same with the paper's group sizes G = ⌈1/p̂⌉
(`sgpo_group_size="inverse_success"`): the batches' groups, their advantages, the gradient against fixed groups,
resume, and two processes with a group that straddles them."""

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

G = 4  # conftest: num_generations=4, per_device_train_batch_size=8 → 2 prompts per generation batch
# successes out of every 4 rows of a prompt in one reward call: profiling (4 samples) gives p̂ = successes / 4
SUCCESSES = [4, 1, 3, 0, 2, 4, 0, 3]  # p̂ = [1, .25, .75, 0, .5, 1, 0, .75]
# easy → hard: 2, 7 (0.75, ties by index), 4 (0.5), 1 (0.25); 0 and 5 trivial, dropped; of the unsolvable 3 and 6,
# sgpo_unsolvable_keep=0.5 keeps ⌊0.5·2 + ½⌋ = 1: NumPy permutation(2) seeded [0] is [0, 1] → prompt 3, last
CURRICULUM = [2, 7, 4, 1, 3]


class ScriptedReward:
    """Per prompt, the j-th row of that prompt in a reward call gets 1 when `j mod 4 < SUCCESSES[prompt]`; records
    every call's prompt indices (one per row)."""

    __name__ = "scripted_reward"

    def __init__(self, texts, successes=SUCCESSES):
        self.index = {t: i for i, t in enumerate(texts)}
        self.successes = successes
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rows = [self.index[p[-1]["content"]] for p in prompts]
        self.calls.append(rows)
        seen = {}
        out = []
        for x in rows:
            j = seen.get(x, 0)
            seen[x] = j + 1
            out.append(1.0 if j % 4 < self.successes[x] else 0.0)
        return out


def _data():
    data = arithmetic_dataset(8, seed=0)
    return data, [row["prompt"][-1]["content"] for row in data]


def ours(tmp_path, reward, data, peft=False, group_size="fixed", **flags):
    flags = {"rollout_filter": "sgpo", "sgpo_unsolvable_keep": 0.5, "sgpo_group_size": group_size, **flags}
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, dataset=data,
                         reward_funcs=[reward], **flags)


def _groups(call):
    return [call[i : i + G] for i in range(0, len(call), G)]


def test_profiling_then_easy_to_hard_batches(tmp_path):
    data, texts = _data()
    reward = ScriptedReward(texts)
    trainer = ours(tmp_path, reward, data, max_steps=3)
    trainer.train()
    # profiling: 8 rows per generate call (per_device_train_batch_size) = 2 prompts × 4 samples, 4 calls in prompt
    # order, before any training batch, i.e. under the initial policy
    assert reward.calls[:4] == [[x] * 4 + [x + 1] * 4 for x in (0, 2, 4, 6)]
    state = trainer.variant_state["sgpo"]
    assert state["p_hat"].tolist() == [s / 4 for s in SUCCESSES]
    assert state["order"].tolist() == CURRICULUM and state["served"] == 6
    # training batches: 2 prompts × G rollouts each, walking the curriculum (wrapping after prompt 3)
    assert [_groups(call) for call in reward.calls[4:]] == [[[2] * G, [7] * G], [[4] * G, [1] * G],
                                                            [[3] * G, [2] * G]]
    logged = [h for h in trainer.state.log_history if "groupx/sgpo_kept_fraction" in h]
    assert logged and logged[0]["groupx/sgpo_kept_fraction"] == 5 / 8  # logged once, at the first step


def test_everything_solved_stops_with_a_clear_error(tmp_path):
    data, texts = _data()
    trainer = ours(tmp_path, ScriptedReward(texts, successes=[4] * 8), data)
    with pytest.raises(ValueError, match=r"no prompt to train on \(8 of 8 solved by every profiling sample"):
        trainer.train()


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_plain_grpo(tmp_path, peft):
    data, texts = _data()
    _, base_grads, base_inputs = one_step(build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig,
                                                        tmp_path / "base", peft=peft, dataset=data,
                                                        reward_funcs=[ScriptedReward(texts)]))
    reward = ScriptedReward(texts)
    trainer = ours(tmp_path / "sgpo", reward, data, peft=peft)
    _, grads, inputs = one_step(trainer)
    assert [_groups(call) for call in reward.calls[4:]] == [[[2] * G, [7] * G]]  # the curriculum's first batch
    assert not torch.equal(inputs["prompt_ids"], base_inputs["prompt_ids"])  # other prompts than TRL's sampler
    assert grads_differ(base_grads, grads)


def test_composes_with_gmpo(tmp_path):
    data, texts = _data()
    _, grads, _ = one_step(ours(tmp_path / "sgpo", ScriptedReward(texts), data))
    reward = ScriptedReward(texts)
    _, gmpo_grads, _ = one_step(ours(tmp_path / "gmpo", reward, data, loss_type="gmpo"))
    assert [_groups(call) for call in reward.calls[4:]] == [[[2] * G, [7] * G]]
    assert all(torch.isfinite(g).all() for g in gmpo_grads.values()) and grads_differ(grads, gmpo_grads)


def test_resume_continues_exactly_without_profiling_again(tmp_path):
    data, texts = _data()

    def run(path, resume=None):
        reward = ScriptedReward(texts)
        trainer = ours(path, reward, data, max_steps=3, save_strategy="steps", save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, reward

    full, full_reward = run(tmp_path / "full")
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)["sgpo"]
    assert saved["order"].tolist() == CURRICULUM and saved["served"] == 4
    resumed, resumed_reward = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed_reward.calls == full_reward.calls[-1:]  # no profiling calls; step 3's prompts: 3, then 2
    for key in ("p_hat", "order"):
        assert torch.equal(resumed.variant_state["sgpo"][key], full.variant_state["sgpo"][key])
    assert resumed.variant_state["sgpo"]["served"] == full.variant_state["sgpo"]["served"] == 6
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_profile_their_shards_and_agree(tmp_path):
    launch(Path(__file__).with_name("sgpo_mp_worker.py"), tmp_path, "fixed", timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree"] and result["p_hat_is_scripted"] and result["order_is_curriculum"], result
        assert result["profiled_own_shard"] and result["trained_own_slice"], result


def test_a_rollout_func_is_refused_before_profiling(tmp_path):
    data, texts = _data()
    reward = ScriptedReward(texts)
    trainer = ours(tmp_path, reward, data)
    trainer.rollout_func = lambda *args, **kwargs: None  # TRL would call it for the rollouts; profiling cannot
    with pytest.raises(ValueError, match="cannot reproduce a rollout_func, tools or environments"):
        trainer.train()
    assert reward.calls == []  # nothing was generated or scored


# ---- G = ⌈1/p̂⌉ per prompt (sgpo_group_size="inverse_success") --------------------------------------------------------
# p̂ of the curriculum 2, 7, 4, 1, 3 is .75, .75, .5, .25, 0 → group sizes 2, 2, 2, 4 and the cap num_generations = 4;
# 8 rows per generation batch (fill_row_budget):
INVERSE_BATCHES = [[2, 2, 7, 7, 4, 4, 1, 1],  # 2, 7, 4 (2 each); prompt 1's group cut to the 2 rows left
                   [3, 3, 3, 3, 2, 2, 7, 7],  # 3 (4), then the curriculum wraps: 2, 7
                   [4, 4, 1, 1, 1, 1, 3, 3]]  # 4 (2), 1 (4), 3 cut to 2


def test_inverse_success_groups_fill_each_batch(tmp_path):
    data, texts = _data()
    reward = ScriptedReward(texts)
    trainer = ours(tmp_path, reward, data, group_size="inverse_success", max_steps=3)
    trainer.train()
    assert reward.calls[4:] == INVERSE_BATCHES
    assert trainer.variant_state["sgpo"]["served"] == 10
    logs = [h for h in trainer.state.log_history if "groupx/groups_per_batch" in h]
    assert [h["groupx/groups_per_batch"] for h in logs] == [4, 3, 3]
    # batch 1's rewards (ScriptedReward): prompt 2 → 1 1, 7 → 1 1, 4 → 1 1, 1 → 1 0: three flat groups of four, so
    # 6 of 8 rows have zero std (TRL's fixed view [1 1 1 1], [1 1 1 0] would say 4 of 8)
    assert logs[0]["frac_reward_zero_std"] == 0.75


def test_inverse_success_advantages_are_grpo_within_each_group(tmp_path):
    data, texts = _data()
    trainer = ours(tmp_path, ScriptedReward(texts), data, group_size="inverse_success")
    one_step(trainer)
    # rewards 1 1 | 1 1 | 1 1 | 1 0: only the last group moves, ±0.5 / (std √0.5 + 1e-4)
    a = 0.5 / (0.5**0.5 + 1e-4)
    assert torch.allclose(torch.tensor(list(trainer._logs["advantages"])[-8:]),
                          torch.tensor([0, 0, 0, 0, 0, 0, a, -a]), atol=1e-6)


@pytest.mark.parametrize("peft", [False, True])
def test_inverse_success_gradient_differs_from_fixed_groups(tmp_path, peft):
    data, texts = _data()
    _, fixed, _ = one_step(ours(tmp_path / "fixed", ScriptedReward(texts), data, peft=peft))
    reward = ScriptedReward(texts)
    _, inverse, _ = one_step(ours(tmp_path / "inverse", reward, data, peft=peft, group_size="inverse_success"))
    assert reward.calls[4:] == INVERSE_BATCHES[:1]
    assert grads_differ(fixed, inverse)


def test_inverse_success_runs_a_group_local_estimator_group_by_group(tmp_path):
    data, texts = _data()
    trainer = ours(tmp_path, ScriptedReward(texts), data, group_size="inverse_success", advantage_estimator="rloo")
    _, grads, _ = one_step(trainer)
    # groups 1 1 | 1 1 | 1 1 | 1 0: RLOO's M/(M−1)·(r − mean) with M = 2 gives ±1 on the last group only
    assert torch.allclose(torch.tensor(list(trainer._logs["advantages"])[-8:]),
                          torch.tensor([0, 0, 0, 0, 0, 0, 1.0, -1.0]), atol=1e-6)
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_inverse_success_runs_a_group_agnostic_token_weighting(tmp_path):
    data, texts = _data()
    _, plain, _ = one_step(ours(tmp_path / "plain", ScriptedReward(texts), data, group_size="inverse_success"))
    trainer = ours(tmp_path / "lopti", ScriptedReward(texts), data, group_size="inverse_success",
                   token_weighting="lopti")
    _, grads, _ = one_step(trainer)
    assert all(torch.isfinite(g).all() for g in grads.values()) and grads_differ(plain, grads)


def test_inverse_success_composes_with_gmpo(tmp_path):
    data, texts = _data()
    _, grads, _ = one_step(ours(tmp_path / "grpo", ScriptedReward(texts), data, group_size="inverse_success"))
    _, gmpo, _ = one_step(ours(tmp_path / "gmpo", ScriptedReward(texts), data, group_size="inverse_success",
                               loss_type="gmpo"))
    assert all(torch.isfinite(g).all() for g in gmpo.values()) and grads_differ(grads, gmpo)


def test_inverse_success_resume_continues_exactly(tmp_path):
    data, texts = _data()

    def run(path, resume=None):
        reward = ScriptedReward(texts)
        trainer = ours(path, reward, data, group_size="inverse_success", max_steps=3, save_strategy="steps",
                       save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, reward

    full, full_reward = run(tmp_path / "full")
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)["sgpo"]
    assert saved["served"] == 7 and "pending_sizes" not in saved
    resumed, resumed_reward = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed_reward.calls == full_reward.calls[-1:] == INVERSE_BATCHES[-1:]
    assert resumed.variant_state["sgpo"]["served"] == full.variant_state["sgpo"]["served"] == 10
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_share_a_straddling_group(tmp_path):
    launch(Path(__file__).with_name("sgpo_mp_worker.py"), tmp_path, "inverse_success", timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree"] and result["trained_own_slice"], result
        assert result["advantages_by_hand"], result
