"""GAGPO through the trainer: the counter game played by the shipped tiny model via TRL 1.16's `rollout_func`; one
real step, full and LoRA, and a composition with an objective."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.test_step_credit_trainer import Capture, trainer_for
from trl_groupx.advantages.gagpo import gagpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, step_to_token_advantages, turn_index_from_tool_mask


@pytest.mark.parametrize("peft", [False, True])
def test_gagpo_through_the_trainer(tmp_path, peft):
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", peft, loss_type="grpo"))
    trainer = trainer_for(tmp_path / "gagpo", peft, loss_type="grpo", advantage_estimator="gagpo")
    cap = Capture(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(torch.sort(inputs["completion_ids"], dim=0).values,
                       torch.sort(base_inputs["completion_ids"], dim=0).values)  # same batch (rows shuffled)
    steps = StepBatch.from_lists([x["step_states"] for x in cap.inputs], [x["step_rewards"] for x in cap.inputs])
    kwargs = {k: getattr(trainer.args, k) for k in trainer.variants["advantages"].params}
    step_adv = gagpo_step_advantages(trainer._rewards_per_func[:, 0], 4, steps, **kwargs)
    assert step_adv.abs().sum() > 0
    turns = turn_index_from_tool_mask(cap.output["tool_mask"], cap.output["completion_mask"])
    torch.testing.assert_close(cap.output["advantages"], step_to_token_advantages(step_adv, steps, turns))
    # the turns of one episode carry different advantages (per-step credit, not one number per rollout)
    per_row = [set(cap.output["advantages"][i][turns[i] >= 0].tolist()) for i in range(turns.shape[0])]
    assert any(len(v) > 1 for v in per_row)
    assert grads_differ(base_grads, grads)


def test_gagpo_composes_with_an_objective(tmp_path):
    _, base_grads, _ = one_step(trainer_for(tmp_path / "a", loss_type="grpo", advantage_estimator="gagpo"))
    loss, grads, _ = one_step(trainer_for(tmp_path / "b", loss_type="gmpo", advantage_estimator="gagpo"))
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)


def test_gagpo_flags_checked_at_construction():
    import trl_groupx

    with pytest.raises(ValueError, match="gagpo_lambda"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="gagpo",
                              gagpo_lambda=2.0)
