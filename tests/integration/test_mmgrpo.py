"""mmGRPO through the trainer: the shipped plan → answer toy program (trl_groupx/toy/two_module_program.py) run by
the tiny model via TRL 1.16's `rollout_func`; one real step, full and LoRA."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages.mmgrpo import mmgrpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, step_to_token_advantages, turn_index_from_tool_mask
from trl_groupx.toy.counter_rollout import counter_outcome_reward, make_counter_game_rollout
from trl_groupx.toy.two_module_program import make_two_module_program_rollout, program_score_reward

# the same loss for every run, so that only the advantages differ (the registered flags add beta 0.001)
LOSS = {"loss_type": "dr_grpo", "beta": 0.0}


def trainer_for(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=program_score_reward, max_completion_length=16,
                         rollout_func=make_two_module_program_rollout(), **flags)


class Capture:
    def __init__(self, trainer):
        self.orig = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self

    def __call__(self, inputs):
        self.output = self.orig(inputs)
        self.inputs = inputs
        return self.output


def captured_step(trainer):
    cap = Capture(trainer)
    _, grads, inputs = one_step(trainer)
    return cap, grads, inputs


@pytest.mark.parametrize("peft", [False, True])
def test_mmgrpo_through_the_trainer(tmp_path, peft):
    _, grpo_grads, grpo_inputs = one_step(trainer_for(tmp_path / "grpo", peft, **LOSS))
    flow, flow_grads, _ = captured_step(trainer_for(tmp_path / "agentflow", peft, advantage_estimator="agentflow",
                                                    agentflow_scale=False, **LOSS))
    trainer = trainer_for(tmp_path / "mmgrpo", peft, advantage_estimator="mmgrpo", **LOSS)
    cap, grads, inputs = captured_step(trainer)
    assert torch.equal(torch.sort(inputs["completion_ids"], dim=0).values,
                       torch.sort(grpo_inputs["completion_ids"], dim=0).values)  # same batch (rows shuffled)
    modules = [x["step_modules"] for x in cap.inputs]
    rewards = trainer._rewards_per_func[:, 0]
    # the batch needs what makes the grouping matter: a prompt group with an interrupted and a complete program
    interrupted = torch.tensor([len(m) == 1 for m in modules]).view(2, 4)
    assert (interrupted.any(1) & ~interrupted.all(1)).any(), modules
    assert (rewards[interrupted.flatten()] == -1).all()  # dspy's format-failure score
    # exact expected advantages: the function on the step record TRL carried, laid out on the turns
    steps = StepBatch.from_lists([[0] * len(m) for m in modules], modules=modules)
    step_adv = mmgrpo_step_advantages(rewards, 4, steps)
    turns = turn_index_from_tool_mask(cap.output["tool_mask"], cap.output["completion_mask"])
    torch.testing.assert_close(cap.output["advantages"], step_to_token_advantages(step_adv, steps, turns))
    # against Flow-GRPO without std (the same r − mean broadcast to every turn): equal on the plan turn, and on the
    # answer turn except in groups with an interrupted program, where truncate leaves the answers untrained
    in_interrupted_group = interrupted.any(1).repeat_interleave(4)[:, None]
    same_as_flow = (turns == 0) | ~in_interrupted_group
    torch.testing.assert_close(cap.output["advantages"][same_as_flow], flow.output["advantages"][same_as_flow])
    dropped = (turns == 1) & in_interrupted_group
    assert dropped.any() and (cap.output["advantages"][dropped] == 0).all()
    assert (flow.output["advantages"][dropped] != 0).any()
    assert grads_differ(flow_grads, grads) and grads_differ(grpo_grads, grads)


def test_ragged_trains_the_answers_of_interrupted_groups(tmp_path):
    # seed 1: the first prompt's programs are [complete, complete, complete, interrupted] with scores [0, 1, 1, −1];
    # truncate leaves their answers untrained, ragged groups the three answers ([0, 1, 1] → [−2/3, 1/3, 1/3])
    _, truncate_grads, _ = one_step(trainer_for(tmp_path / "t", advantage_estimator="mmgrpo", **LOSS), seed=1)
    trainer = trainer_for(tmp_path / "r", advantage_estimator="mmgrpo", mmgrpo_grouping="ragged", **LOSS)
    cap = Capture(trainer)
    _, grads, _ = one_step(trainer, seed=1)
    modules = [x["step_modules"] for x in cap.inputs]
    assert [len(m) for m in modules[:4]] == [2, 2, 2, 1] and trainer._rewards_per_func[:4, 0].tolist() == [0, 1, 1, -1]
    steps = StepBatch.from_lists([[0] * len(m) for m in modules], modules=modules)
    step_adv = mmgrpo_step_advantages(trainer._rewards_per_func[:, 0], 4, steps, mmgrpo_grouping="ragged")
    turns = turn_index_from_tool_mask(cap.output["tool_mask"], cap.output["completion_mask"])
    torch.testing.assert_close(cap.output["advantages"], step_to_token_advantages(step_adv, steps, turns))
    torch.testing.assert_close(cap.output["advantages"][:3][turns[:3] == 1].unique(), torch.tensor([-2 / 3, 1 / 3]))
    assert grads_differ(truncate_grads, grads)


def test_registered_flags_train_and_compose_with_an_objective(tmp_path):
    flags = trl_groupx.get_variant("mmgrpo").flags
    loss, base_grads, _ = one_step(trainer_for(tmp_path / "a", **flags))  # dr_grpo, beta 0.001, epsilon_high 0.28
    assert torch.isfinite(loss)
    loss, grads, _ = one_step(trainer_for(tmp_path / "b", **{**flags, "loss_type": "gmpo"}))
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)


def test_requested_without_a_program_rollout_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="advantage_estimator='mmgrpo' groups the LM calls.*step_modules"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, advantage_estimator="mmgrpo")


def test_rollout_without_module_labels_is_refused_at_the_first_batch(tmp_path):
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, advantage_estimator="mmgrpo",
                            reward_funcs=counter_outcome_reward, max_completion_length=64,
                            rollout_func=make_counter_game_rollout())
    with pytest.raises(ValueError, match="return a `step_modules` list"):
        one_step(trainer)
