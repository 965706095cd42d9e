"""Multi-turn step credit (issue 8) on real TRL rollouts: the counter game played by the shipped tiny model through
TRL 1.16's `rollout_func`, one real step, full and LoRA.

The advantage stage cannot receive per-step data yet, so `StepCreditPrototype` below applies the core change
proposed in the issue-8 report, for one process: after TRL's `_generate_and_score_completions`, read the step
record TRL merged into each row's input dict (the rollout_func extra fields `step_states`, `step_rewards`), compute
the per-step advantages with the variant's pure function on the row rewards, and lay them out on the turns of
`output["tool_mask"]` as `(B, T)` advantages. These tests pin (1) that TRL's rollout path carries what the
functions need, (2) that the turn layout matches the step record, (3) that the gradient changes against plain
GRPO on the same batch, and (4) a composition with an objective variant.
"""

import functools

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages.agentflow import agentflow_step_advantages
from trl_groupx.advantages.gigpo import gigpo_step_advantages
from trl_groupx.advantages.hgpo import hgpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, step_to_token_advantages, turn_index_from_tool_mask
from trl_groupx.toy.counter_rollout import counter_outcome_reward, make_counter_game_rollout

PEFT = [False, True]
VARIANTS = {
    "gigpo": functools.partial(gigpo_step_advantages, gigpo_gamma=0.95),
    "hgpo": functools.partial(hgpo_step_advantages, hgpo_history_length=2),
    "agentflow_steps": functools.partial(agentflow_step_advantages, agentflow_episode_stats="steps"),
}


class StepCreditPrototype(trl_groupx.GRPOTrainer):
    """The proposed core change, single process: step-structured advantages → `(B, T)` token advantages."""

    step_fn = None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        steps = StepBatch.from_lists([x["step_states"] for x in inputs], [x["step_rewards"] for x in inputs])
        rewards = self._rewards_per_func[:, 0]
        step_adv = type(self).step_fn(rewards, self.num_generations, steps)
        turns = turn_index_from_tool_mask(output["tool_mask"], output["completion_mask"])
        output["advantages"] = step_to_token_advantages(step_adv, steps, turns)
        self.captured = {"output": dict(output), "steps": steps, "step_adv": step_adv, "turns": turns,
                         "rewards": rewards}
        return output


def trainer_for(tmp_path, cls=trl_groupx.GRPOTrainer, peft=False, **flags):
    trainer = build_trainer(cls, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=counter_outcome_reward,
                            max_completion_length=64, **flags)
    trainer.rollout_func = make_counter_game_rollout()
    return trainer


def prototype(tmp_path, fn, peft=False, **flags):
    cls = type("Proto", (StepCreditPrototype,), {"step_fn": staticmethod(fn)})
    return trainer_for(tmp_path, cls, peft, **flags)


def test_trl_rollout_func_carries_the_step_structure(tmp_path):
    trainer = prototype(tmp_path, VARIANTS["gigpo"])
    one_step(trainer)
    cap = trainer.captured
    # one model turn per recorded step: the turns of TRL's tool_mask match the step record row by row
    n_turns = cap["turns"].max(dim=1).values + 1
    assert n_turns.tolist() == torch.bincount(cap["steps"].episode, minlength=len(n_turns)).tolist()
    # the reward function saw the extra field `outcome`; the rewards are the counter-game outcomes (0/1)
    assert set(cap["rewards"].tolist()) <= {0.0, 1.0}
    # every model token of turn j carries step j's advantage; tool-result tokens and padding carry 0
    adv, turns = cap["output"]["advantages"], cap["turns"]
    for row in range(adv.shape[0]):
        for j in range(int(n_turns[row])):
            step = ((cap["steps"].episode == row) & (cap["steps"].index == j)).nonzero().item()
            assert (adv[row][turns[row] == j] == cap["step_adv"][step]).all()
    assert (adv[turns < 0] == 0).all()


@pytest.mark.parametrize("peft", PEFT)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_step_credit_changes_gradient(tmp_path, peft, variant):
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", peft=peft, loss_type="grpo"))
    trainer = prototype(tmp_path / variant, VARIANTS[variant], peft=peft, loss_type="grpo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(torch.sort(inputs["completion_ids"], dim=0).values,
                       torch.sort(base_inputs["completion_ids"], dim=0).values)  # same batch (rows shuffled)
    assert inputs["advantages"].shape == inputs["completion_ids"].shape
    assert grads_differ(base_grads, grads)


def test_agentflow_trajectory_stats_is_grpo_on_episode_rows(tmp_path):
    # Flow-GRPO with the paper's trajectory statistics is TRL's GRPO on whole-episode rows (ε 1e-6 vs 1e-4)
    trainer = prototype(tmp_path, agentflow_step_advantages, loss_type="grpo")
    one_step(trainer)
    cap = trainer.captured
    grpo = trl_groupx.advantages.group_normalized_advantages(cap["rewards"], 4, scale_rewards="group")
    model_tok = cap["turns"] >= 0
    expected = grpo[:, None].expand_as(cap["output"]["advantages"])
    torch.testing.assert_close(cap["output"]["advantages"][model_tok], expected[model_tok], atol=1e-3, rtol=1e-3)


def test_composes_with_an_objective_variant(tmp_path):
    _, base_grads, _ = one_step(prototype(tmp_path / "a", VARIANTS["gigpo"], loss_type="grpo"))
    trainer = prototype(tmp_path / "b", VARIANTS["gigpo"], loss_type="gmpo")
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)
