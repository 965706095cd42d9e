"""EBPO: one real step on the tiny model (full and LoRA) changes the gradient against plain GRPO with the
advantages the formula gives; composes with GMPO; a resumed run continues exactly (weights and state)."""

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from trl_groupx.advantages.ebpo import ebpo_advantages
from trl_groupx.trainer import VARIANT_STATE_NAME


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_ebpo_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    trainer = ours(tmp_path / "ebpo", peft, advantage_estimator="ebpo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    expected = ebpo_advantages(trainer._rewards_per_func[:, 0], 4, state={})  # first step: empty prior
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    assert trainer.variant_state["ebpo"]["reward_count"] == 8
    assert grads_differ(base_grads, grads)


def test_ebpo_composes_with_gmpo_objective(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="ebpo", ebpo_scale_rewards="none")
    _, grads, inputs = one_step(trainer)
    expected = ebpo_advantages(trainer._rewards_per_func[:, 0], 4, ebpo_scale_rewards="none", state={})
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())


def _run(path, **overrides):
    return ours(path, advantage_estimator="ebpo", max_steps=3, save_strategy="steps", save_steps=1, **overrides)


def test_ebpo_resume_continues_exactly(tmp_path):
    full = _run(tmp_path / "full")
    full.train()
    state = full.variant_state["ebpo"]
    assert state["reward_count"] == 3 * 8 and state["group_count"] == 3 * 2
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert saved["ebpo"]["reward_count"] == 2 * 8

    resumed = _run(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    other = resumed.variant_state["ebpo"]
    assert other.keys() == state.keys()
    for key in state:
        assert torch.equal(torch.as_tensor(other[key]), torch.as_tensor(state[key])), key
    assert_same_weights(full, resumed)
