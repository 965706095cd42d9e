"""DAPO dynamic sampling with refill on the tiny model: full batches of mixed groups, refill prompts from the seeded
source, gradient vs plain GRPO, the cap, compositions, checkpoint/resume, evaluation."""

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, generate_first_batch, grads_differ, one_step
from trl_groupx.sampling.dapo_dynamic_sampling import draw_refill_indices
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

G = 4  # conftest: num_generations 4, per_device_train_batch_size 8 -> 2 groups per generation call
DATASET = arithmetic_dataset(64, seed=0)


def solved_then_one_right(completions, **kwargs):
    """Per generation call: group 0 all correct (zero variance, dropped), group 1 = [1, 0, 0, 0] (kept). So every
    call yields exactly one kept group and a batch of 2 groups needs exactly 2 calls."""
    return [1.0 if i < G else float(i == G) for i in range(len(completions))]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


class Recorder:
    """Reward wrapper recording the prompts and the call count of every generation call."""

    def __init__(self, fn):
        self.fn, self.calls, self.__name__ = fn, [], fn.__name__

    def __call__(self, prompts, completions, **kwargs):
        self.calls.append([p[-1]["content"] for p in prompts])
        return self.fn(completions, call=len(self.calls) - 1, **kwargs)


def _trainer(tmp_path, peft=False, dapo=True, **flags):
    flags = {"loss_type": "dapo", "shuffle_dataset": False, **flags}
    if dapo:
        flags.setdefault("rollout_filter", "dapo_dynamic_sampling")
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, dataset=DATASET, **flags)


def _generate(trainer):
    """The generation output of the first batch, unshuffled (`generate_first_batch`)."""
    return generate_first_batch(trainer)[1]


def _group_formula(r):
    r = r.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_refill_fills_the_batch_with_mixed_groups_from_the_refill_source(tmp_path, peft):
    reward = Recorder(solved_then_one_right)
    trainer = _trainer(tmp_path, peft, reward_funcs=reward)
    output = _generate(trainer)
    assert len(reward.calls) == 2  # one refill round
    metrics = trainer._metrics["train"]
    assert metrics["groupx/dapo_gen_batches"] == [2.0] and metrics["groupx/dapo_kept_groups"] == [2.0]
    assert metrics["groupx/kept_fraction"] == [1.0]
    # exactly the original size, and no zero-variance group: [call 0 group 1, call 1 group 1]
    assert output["completion_ids"].size(0) == output["prompt_ids"].size(0) == output["advantages"].size(0) == 8
    r = trainer._rewards_per_func[:, 0]
    assert r.tolist() == [1.0, 0.0, 0.0, 0.0] * 2
    assert (r.view(-1, G).std(1) > 0).all()
    torch.testing.assert_close(output["advantages"], _group_formula(r))
    assert output["num_items_in_batch"] == output["completion_mask"].sum()
    # the refill prompts are the next prompts of the seeded refill source (this process: slice 0 of 2 groups)
    refill = draw_refill_indices({}, len(DATASET), 2, seed=0)
    expected = [DATASET[i]["prompt"][-1]["content"] for i in refill for _ in range(G)]
    assert reward.calls[1] == expected
    assert trainer.variant_state["dapo_dynamic_sampling"] == {"epoch": 0, "position": 2}
    kept_prompts = reward.calls[0][G:] + reward.calls[1][G:]
    assert [p[-1]["content"] for p in trainer._logs["prompt"]] == kept_prompts  # completions table = what trains
    tok = trainer.processing_class
    for row, text in enumerate(kept_prompts):
        ids = output["prompt_ids"][row][output["prompt_mask"][row].bool()]
        assert text in tok.decode(ids)
    # left-padded prompts, right-padded completions: the masks are contiguous on the right / left side
    pm, cm = output["prompt_mask"], output["completion_mask"]
    assert (pm.diff(dim=1) >= 0).all() and (cm.diff(dim=1) <= 0).all()


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_refill_changes_the_gradient(tmp_path, peft):
    _, base, _ = one_step(_trainer(tmp_path / "a", peft, dapo=False, reward_funcs=solved_then_one_right))
    loss, grads, inputs = one_step(_trainer(tmp_path / "b", peft, reward_funcs=solved_then_one_right))
    assert torch.isfinite(loss) and grads_differ(base, grads)
    assert inputs["completion_ids"].size(0) == 8 and (inputs["advantages"] != 0).any()


def test_composes_with_an_advantage_variant_and_an_objective(tmp_path):
    trainer = _trainer(tmp_path / "a", advantage_estimator="sign_adv", reward_funcs=solved_then_one_right)
    output = _generate(trainer)
    r = trainer._rewards_per_func[:, 0]
    torch.testing.assert_close(output["advantages"], 2 * r - 1)  # recomputed on the merged batch
    _, base, _ = one_step(_trainer(tmp_path / "b", dapo=False, loss_type="gmpo", advantage_estimator="sign_adv",
                                   reward_funcs=solved_then_one_right))
    loss, grads, _ = one_step(_trainer(tmp_path / "c", loss_type="gmpo", advantage_estimator="sign_adv",
                                       reward_funcs=solved_then_one_right))
    assert torch.isfinite(loss) and grads_differ(base, grads)


def test_cap_reached_with_no_mixed_group_trains_nothing(tmp_path):
    reward = Recorder(constant_reward)
    trainer = _trainer(tmp_path, reward_funcs=reward, dapo_max_gen_batches=3)
    loss, grads, inputs = one_step(trainer)
    assert len(reward.calls) == 3 and trainer._metrics["train"]["groupx/dapo_gen_batches"] == [3.0]
    assert trainer._metrics["train"]["groupx/dapo_kept_groups"] == [0.0]
    assert trainer.variant_state["dapo_dynamic_sampling"]["position"] == 4  # 2 refill rounds x 2 prompts
    assert inputs["completion_ids"].size(0) == 8 and (inputs["completion_mask"] == 0).all()
    assert (inputs["advantages"] == 0).all() and inputs["num_items_in_batch"] == 0
    assert torch.isfinite(loss) and all((g == 0).all() for g in grads.values())


def test_cap_fills_with_the_earliest_dropped_groups(tmp_path):
    def first_call_only(completions, call, **kwargs):  # call 0: one mixed group; later calls: all equal
        return solved_then_one_right(completions) if call == 0 else constant_reward(completions)

    reward = Recorder(first_call_only)
    trainer = _trainer(tmp_path, reward_funcs=reward, dapo_max_gen_batches=2)
    output = _generate(trainer)
    assert len(reward.calls) == 2 and trainer._metrics["train"]["groupx/dapo_kept_groups"] == [1.0]
    # rows 0-3: call 0 group 1 (kept); rows 4-7: call 0 group 0 (earliest dropped), neutralised
    assert [p[-1]["content"] for p in trainer._logs["prompt"]] == reward.calls[0][G:] + reward.calls[0][:G]
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert (output["completion_mask"][G:] == 0).all() and (output["advantages"][G:] == 0).all()
    assert (output["completion_mask"][:G].sum(-1) > 0).all() and (output["advantages"][:G] != 0).all()
    assert trainer._metrics["train"]["groupx/kept_fraction"] == [0.5]


def test_no_cap_keeps_generating(tmp_path):
    def mixed_from_call_3(completions, call, **kwargs):
        return solved_then_one_right(completions) if call >= 3 else constant_reward(completions)

    reward = Recorder(mixed_from_call_3)
    trainer = _trainer(tmp_path, reward_funcs=reward, dapo_max_gen_batches=0)
    _generate(trainer)
    # calls 3 and 4 give one mixed group each
    assert len(reward.calls) == 5 and trainer._metrics["train"]["groupx/dapo_gen_batches"] == [5.0]
    assert (trainer._rewards_per_func[:, 0].view(-1, G).std(1) > 0).all()


def test_checkpoint_resume_continues_the_refill_source_exactly(tmp_path):
    def run(path, resume=None):
        reward = Recorder(solved_then_one_right)
        trainer = _trainer(path, reward_funcs=reward, max_steps=3, save_strategy="steps", save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, reward

    full, full_reward = run(tmp_path / "full")
    assert full.variant_state["dapo_dynamic_sampling"] == {"epoch": 0, "position": 6}  # 3 steps x 1 round x 2
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert saved["dapo_dynamic_sampling"] == {"epoch": 0, "position": 4}
    resumed, resumed_reward = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.variant_state == full.variant_state
    assert resumed_reward.calls == full_reward.calls[-2:]  # step 3: same batch prompts, same refill prompts
    assert_same_weights(full, resumed)


def test_evaluation_neither_refills_nor_advances_the_source(tmp_path):
    reward = Recorder(solved_then_one_right)
    trainer = _trainer(tmp_path, reward_funcs=reward)
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    assert len(reward.calls) == 1 and trainer.variant_state["dapo_dynamic_sampling"] == {}
    assert (output["completion_mask"][:G] == 0).all()  # the filter still drops the zero-variance group


def test_refilled_batch_is_split_over_accumulation_steps(tmp_path):
    # per_device_train_batch_size 4 x steps_per_generation 2 = 8 rollouts per generation batch (2 whole groups);
    # TRL shuffles the merged batch and splits it into 2 micro-batches of 4
    reward = Recorder(solved_then_one_right)
    trainer = _trainer(tmp_path, reward_funcs=reward, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    loss, _, _ = one_step(trainer)
    assert len(reward.calls) == 2 and torch.isfinite(loss)
    slices = trainer._buffered_inputs
    assert len(slices) == 2 and all(s["completion_ids"].size(0) == 4 for s in slices)
    advantages = torch.cat([s["advantages"] for s in slices])
    torch.testing.assert_close(advantages.sort().values, _group_formula(trainer._rewards_per_func[:, 0]).sort().values)
