"""MO-GRPO: one real step on the tiny model with two reward functions of very different scales (full and LoRA);
the advantages are exactly the per-function z-score sum and the gradient differs from plain GRPO."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from trl_groupx.advantages.mo_grpo import mo_grpo_advantages


def length_reward(completions, **kwargs) -> list[float]:
    """A second objective on a much larger scale (10 × characters), which dominates summed-reward GRPO."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [10.0 * len(t) for t in texts]


REWARDS = [parity_reward, length_reward]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=REWARDS,
                         **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_mo_grpo_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    trainer = ours(tmp_path / "mo", peft, advantage_estimator="mo_grpo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    per_func = trainer._rewards_per_func
    assert per_func.shape[1] == 2
    expected = mo_grpo_advantages(per_func, 4)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    assert grads_differ(base_grads, grads)


def test_mo_grpo_composes_with_gmpo_objective_and_reward_weights(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="mo_grpo", reward_weights=[2.0, 1.0])
    _, grads, inputs = one_step(trainer)
    expected = mo_grpo_advantages(trainer._rewards_per_func, 4, reward_weights=[2.0, 1.0])
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())
