"""GraphGPO through the trainer: the counter game played by the shipped tiny model via TRL 1.16's `rollout_func`,
with the optional `step_final_state` field; one real step, full and LoRA, and a composition with an objective."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.test_step_credit_trainer import Capture, trainer_for
from trl_groupx.advantages.graphgpo import graphgpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, state_key, step_to_token_advantages, turn_index_from_tool_mask
from trl_groupx.toy.counter_rollout import make_counter_game_rollout


def with_final_state(rollout):
    """The counter game (target 3, at most 3 moves of +1/+2) ends on 3 when won and can only be lost by overshooting
    to 4, so the observation after the last move follows from the outcome."""

    def wrapped(prompts, trainer):
        out = rollout(prompts, trainer)
        out["step_final_state"] = ["counter=3" if o == 1.0 else "counter=4" for o in out["outcome"]]
        return out

    return wrapped


@pytest.mark.parametrize("peft", [False, True])
@pytest.mark.parametrize("final_state", [False, True])
def test_graphgpo_through_the_trainer(tmp_path, peft, final_state):
    rollout = make_counter_game_rollout()
    rollout = with_final_state(rollout) if final_state else rollout
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", peft, loss_type="grpo"))
    trainer = trainer_for(tmp_path / "graphgpo", peft, loss_type="grpo", advantage_estimator="graphgpo")
    trainer.rollout_func = rollout
    cap = Capture(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(torch.sort(inputs["completion_ids"], dim=0).values,
                       torch.sort(base_inputs["completion_ids"], dim=0).values)  # same batch (rows shuffled)
    finals = [x["step_final_state"] for x in cap.inputs] if final_state else None
    steps = StepBatch.from_lists([x["step_states"] for x in cap.inputs], [x["step_rewards"] for x in cap.inputs],
                                 finals)
    if final_state:  # the trainer carried the field into StepBatch.final_state (keys hashed once more, as states)
        assert trainer._steps.final_state.tolist() == [state_key(state_key(f)) for f in finals]
    else:
        assert trainer._steps.final_state is None
    kwargs = {k: getattr(trainer.args, k) for k in trainer.variants["advantages"].params}
    rewards = trainer._rewards_per_func[:, 0]
    assert 0 < rewards.sum() < rewards.numel()  # both outcomes in the batch: the goal is in the graph
    step_adv = graphgpo_step_advantages(rewards, 4, steps, **kwargs)
    turns = turn_index_from_tool_mask(cap.output["tool_mask"], cap.output["completion_mask"])
    torch.testing.assert_close(cap.output["advantages"], step_to_token_advantages(step_adv, steps, turns))
    # the turns of one episode carry different advantages (per-step credit, not one number per rollout)
    per_row = [set(cap.output["advantages"][i][turns[i] >= 0].tolist()) for i in range(turns.shape[0])]
    assert any(len(v) > 1 for v in per_row)
    assert grads_differ(base_grads, grads)


def test_graphgpo_composes_with_an_objective(tmp_path):
    _, base_grads, _ = one_step(trainer_for(tmp_path / "a", loss_type="grpo", advantage_estimator="graphgpo"))
    loss, grads, _ = one_step(trainer_for(tmp_path / "b", loss_type="gmpo", advantage_estimator="graphgpo"))
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)


def test_graphgpo_flags_checked_at_construction():
    import trl_groupx

    with pytest.raises(ValueError, match="graphgpo_gamma"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="graphgpo",
                              graphgpo_gamma=0.0)


def test_collect_steps_reads_the_optional_final_state(tmp_path):
    trainer = trainer_for(tmp_path, advantage_estimator="graphgpo")
    rows = [{"step_states": ["counter=0"], "step_rewards": [0.0], "step_final_state": "counter=2"},
            {"step_states": ["counter=0", "counter=1"], "step_rewards": [0.0, 0.0]}]
    steps = trainer._collect_steps(rows)
    assert steps.final_state.tolist() == [state_key(state_key("counter=2")), -1]  # -1: NO_FINAL_STATE
    assert trainer._collect_steps([rows[1]]).final_state is None  # no row gave one: the field stays None
