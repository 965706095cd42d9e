"""GPG valid-group rescaling: one real step on the tiny model (full and LoRA) trains on exactly
(r − mean_g)·B/(B − M) and changes the gradient against plain GRPO; composes with GPG's loss (objective stage)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages import gpg_valid_rescale_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def by_hand(rewards, g=4, floor=0.5):
    r = rewards.view(-1, g)
    valid = r.amax(1) > r.amin(1)
    alpha = 1 / max(valid.float().mean().item(), floor) if valid.any() else 0.0
    return ((r - r.mean(1, keepdim=True)) * valid[:, None] * alpha).reshape(-1)


@pytest.mark.parametrize("peft", [False, True])
def test_changes_gradient_and_uses_formula(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "v", peft, loss_type="grpo", advantage_estimator="gpg_valid_rescale")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    expected = gpg_valid_rescale_advantages(rewards, 4)
    torch.testing.assert_close(expected, by_hand(rewards))
    groups = rewards.view(-1, 4)
    assert (groups.amax(1) == groups.amin(1)).any()  # this batch has an all-equal group, so α ≠ 1 is exercised
    # TRL shuffles the rollouts after scoring: compare as multisets
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert expected.abs().sum() > 0 and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)


def test_composes_with_gpg_loss(tmp_path):
    trainer = ours(tmp_path, loss_type="gpg", beta=0.0,
                   advantage_estimator="gpg_valid_rescale")
    loss, grads, inputs = one_step(trainer)
    expected = gpg_valid_rescale_advantages(trainer._rewards_per_func[:, 0], 4)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
