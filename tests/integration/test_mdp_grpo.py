"""MDP-GRPO advantages: one real step on the tiny model (full and LoRA) changes the gradient against plain GRPO and
trains with exactly the dual-anchor + prospect advantages; composes with another stage's variant (GMPO objective)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages import mdp_grpo_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_mdp_grpo_changes_gradient_and_uses_formula(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "mdp", peft, loss_type="grpo", advantage_estimator="mdp_grpo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    expected = mdp_grpo_advantages(trainer._rewards_per_func[:, 0], 4)
    # TRL shuffles the rollouts after scoring: compare as multisets
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)


def test_mdp_grpo_composes_with_gmpo(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="mdp_grpo", mdp_grpo_goal_mode="half")
    loss, grads, inputs = one_step(trainer)
    expected = mdp_grpo_advantages(trainer._rewards_per_func[:, 0], 4, mdp_grpo_goal_mode="half")
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
