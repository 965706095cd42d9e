"""MathForge DGPO: one real step on the tiny model (full and LoRA); the advantages are exactly DGAE×DQW of the
batch's rewards and the gradient differs from plain GRPO; composes with a trl_groupx objective (GMPO)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages.mathforge_dgpo import mathforge_dgpo_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_mathforge_dgpo_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "dgpo", peft, loss_type="dapo", advantage_estimator="mathforge_dgpo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    assert rewards.view(-1, 4).std(1).gt(0).any()  # at least one informative group
    # TRL shuffles the generation batch before handing it out: compare as multisets
    torch.testing.assert_close(inputs["advantages"].sort().values, mathforge_dgpo_advantages(rewards, 4).sort().values)
    assert not torch.allclose(inputs["advantages"], base_inputs["advantages"])
    assert grads_differ(base_grads, grads)


def test_mathforge_dgpo_composes_with_gmpo_objective(tmp_path):
    _, gmpo_grads, _ = one_step(ours(tmp_path / "a", loss_type="gmpo"))
    trainer = ours(tmp_path / "b", loss_type="gmpo", advantage_estimator="mathforge_dgpo",
                   mathforge_dgpo_dqw_temperature=1.0)
    _, grads, inputs = one_step(trainer)
    rewards = trainer._rewards_per_func[:, 0]
    expected = mathforge_dgpo_advantages(rewards, 4, mathforge_dgpo_dqw_temperature=1.0)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads_differ(gmpo_grads, grads)
