"""Multi-turn step credit (issue 8) through the trainer: `advantage_estimator` in {agentflow, gigpo, hgpo} on the
counter game played by the shipped tiny model via TRL 1.16's `rollout_func`; one real step, full and LoRA."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages.agentflow import agentflow_step_advantages
from trl_groupx.advantages.gigpo import gigpo_step_advantages
from trl_groupx.advantages.hgpo import hgpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, step_to_token_advantages, turn_index_from_tool_mask
from trl_groupx.toy.counter_game import CounterGame
from trl_groupx.toy.counter_rollout import counter_outcome_reward, make_counter_game_rollout

PEFT = [False, True]
FNS = {"agentflow": agentflow_step_advantages, "gigpo": gigpo_step_advantages, "hgpo": hgpo_step_advantages}
FLAGS = {"agentflow": {"agentflow_episode_stats": "steps"}, "gigpo": {}, "hgpo": {}}


def trainer_for(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=counter_outcome_reward, max_completion_length=64,
                         rollout_func=make_counter_game_rollout(), **flags)


class Capture:
    def __init__(self, trainer):
        self.trainer, self.orig = trainer, trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self

    def __call__(self, inputs):
        self.output = self.orig(inputs)
        self.inputs = inputs
        return self.output


@pytest.mark.parametrize("peft", PEFT)
@pytest.mark.parametrize("variant", sorted(FNS))
def test_step_credit_through_the_trainer(tmp_path, peft, variant):
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", peft, loss_type="grpo"))
    trainer = trainer_for(tmp_path / variant, peft, loss_type="grpo", advantage_estimator=variant, **FLAGS[variant])
    cap = Capture(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(torch.sort(inputs["completion_ids"], dim=0).values,
                       torch.sort(base_inputs["completion_ids"], dim=0).values)  # same batch (rows shuffled)
    # exact expected advantages: the variant's function on the step record TRL carried, laid out on the turns
    steps = StepBatch.from_lists([x["step_states"] for x in cap.inputs], [x["step_rewards"] for x in cap.inputs])
    kwargs = {k: getattr(trainer.args, k) for k in trainer.variants["advantages"].params}
    step_adv = FNS[variant](trainer._rewards_per_func[:, 0], 4, steps, **kwargs)
    turns = turn_index_from_tool_mask(cap.output["tool_mask"], cap.output["completion_mask"])
    torch.testing.assert_close(cap.output["advantages"], step_to_token_advantages(step_adv, steps, turns))
    assert (turns.max(dim=1).values + 1).tolist() == torch.bincount(steps.episode, minlength=8).tolist()
    assert grads_differ(base_grads, grads)


def test_composes_with_objective_and_sampling(tmp_path):
    _, base_grads, _ = one_step(trainer_for(tmp_path / "a", loss_type="grpo", advantage_estimator="gigpo"))
    trainer = trainer_for(tmp_path / "b", loss_type="gmpo", advantage_estimator="gigpo")
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)


def test_environment_step_structure_is_read(tmp_path):
    trainer = trainer_for(tmp_path, advantage_estimator="gigpo")
    envs = [CounterGame() for _ in range(2)]
    envs[0].add(2)
    trainer.environments = envs
    steps = trainer._collect_steps([{"prompt": "x"}, {"prompt": "y"}])
    assert steps.episode.tolist() == [0, 0, 1] and steps.reward.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="step_states"):
        trainer.environments = None
        trainer._collect_steps([{"prompt": "x"}])


def test_token_weighting_cannot_follow():
    with pytest.raises(ValueError, match="token_weighting"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="hgpo",
                              token_weighting="gtpo_entropy")


def test_step_credit_without_a_rollout_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="advantage_estimator='gigpo' assigns credit to the turns.*pass a rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, advantage_estimator="gigpo")
