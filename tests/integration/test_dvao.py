"""DVAO: one real step on the tiny model with two reward functions (full and LoRA); the advantages are exactly the
variance-weighted per-reward z-scores and the gradient differs from plain GRPO; composes with GMPO."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from trl_groupx.advantages.dvao import dvao_advantages


def length_reward(completions, **kwargs) -> list[float]:
    """Second objective on a larger scale (characters / 4): its within-group variance dominates the weights."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 4 for t in texts]


REWARDS = [parity_reward, length_reward]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=REWARDS,
                         **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_dvao_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    trainer = ours(tmp_path / "dvao", peft, advantage_estimator="dvao")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    expected = dvao_advantages(trainer._rewards_per_func, 4)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    assert grads_differ(base_grads, grads)


def test_dvao_composes_with_gmpo_objective(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="dvao", dvao_variance_power=1.0)
    _, grads, inputs = one_step(trainer)
    expected = dvao_advantages(trainer._rewards_per_func, 4, dvao_variance_power=1.0)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())
