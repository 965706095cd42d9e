"""WAPO on the tiny model: one real step, full and LoRA; positive-only advantages, gradient differs from GRPO."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def expected_centred(rewards, group_size):
    return rewards - rewards.view(-1, group_size).mean(1).repeat_interleave(group_size)


@pytest.mark.parametrize("peft", [False, True])
def test_wapo_keeps_only_positive_completions_and_changes_gradient(tmp_path, peft):
    common = dict(loss_type="dr_grpo", scale_rewards="none", epsilon_high=9.0)
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, **common))
    trainer = ours(tmp_path / "wapo", peft, token_weighting="wapo", **common)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    mask = inputs["completion_mask"].float()
    rewards = trainer._rewards_per_func[:, 0]
    adv = inputs["advantages"]
    assert adv.shape == inputs["completion_ids"].shape
    # TRL shuffles the generation batch; the base run (same seed) holds the same rows in the same order, with
    # TRL's mean-centred advantages r − mean (scale_rewards="none").
    centred = base_inputs["advantages"]
    torch.testing.assert_close(torch.sort(centred).values, torch.sort(expected_centred(rewards, 4)).values)
    n_pos_groups = int((expected_centred(rewards, 4).view(-1, 4) > 0).any(1).sum())
    scale = (len(rewards) // 4) / max(1, n_pos_groups)
    torch.testing.assert_close(adv, torch.where(centred > 0, centred, 0.0)[:, None] * scale * mask)
    assert (adv >= 0).all() and (adv > 0).any()
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("loss_type", ["cispo", "gmpo"])
def test_wapo_composes_with_other_objectives(tmp_path, loss_type):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type=loss_type))
    trainer = ours(tmp_path / "wapo", loss_type=loss_type, token_weighting="wapo")
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss)
    adv = inputs["advantages"]
    assert (adv >= 0).all() and (adv[inputs["completion_mask"] == 0] == 0).all()
    assert grads_differ(base_grads, grads)


def test_wapo_composes_with_an_advantage_estimator(tmp_path):
    # sign_adv gives ±1; WAPO keeps the +1 completions only (times #groups / #positive groups)
    trainer = ours(tmp_path / "wapo", loss_type="dr_grpo", advantage_estimator="sign_adv", token_weighting="wapo")
    _, grads, inputs = one_step(trainer)
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    rewards = trainer._rewards_per_func[:, 0]
    n_pos_groups = int((rewards.view(-1, 4) > 0.5).any(1).sum())
    scale = (len(rewards) // 4) / max(1, n_pos_groups)
    values = {round(v, 6) for v in adv[mask.bool()].tolist()}
    assert values <= {0.0, round(scale, 6)} and round(scale, 6) in values
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="dr_grpo", advantage_estimator="sign_adv"))
    assert grads_differ(base_grads, grads)
