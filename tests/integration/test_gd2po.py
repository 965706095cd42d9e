"""GD²PO: one real step on the tiny model with two reward functions (full and LoRA); the advantages are exactly
the conflict-filtered, keep-ratio-scaled, whitened per-reward sum and the gradient differs from plain GRPO."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from trl_groupx.advantages.gd2po import gd2po_advantages


def odd_length_reward(completions, **kwargs) -> list[float]:
    """A second 0/1 objective independent of the parity reward (odd number of characters), so that rollouts with
    mixed-sign per-reward advantages occur."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(t) % 2) for t in texts]


REWARDS = [parity_reward, odd_length_reward]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=REWARDS,
                         **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_gd2po_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    trainer = ours(tmp_path / "gd2po", peft, advantage_estimator="gd2po")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    expected = gd2po_advantages(trainer._rewards_per_func, 4, gd2po_conflict_threshold=0.8)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    assert grads_differ(base_grads, grads)


def test_gd2po_hard_mode_composes_with_gmpo_objective(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="gd2po", gd2po_conflict_threshold=1.0)
    _, grads, inputs = one_step(trainer)
    expected = gd2po_advantages(trainer._rewards_per_func, 4, gd2po_conflict_threshold=1.0)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())
