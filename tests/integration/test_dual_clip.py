"""Dual-clip PPO on the tiny model: GRPO on-policy, capped off-policy; full and LoRA; split invariance."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import (
    assert_on_policy_matches,
    assert_split_invariant,
    current_logps,
    loss_and_grads,
    off_policy_batch,
    off_policy_loss_and_grads,
    ours,
)

PEFT = [False, True]


@pytest.mark.parametrize("peft", PEFT)
def test_dual_clip_on_and_off_policy(tmp_path, peft):
    # on-policy ρ = 1: nothing is clipped or capped → the same gradient as the clipped surrogate (dapo's token mean)
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "dapo", "epsilon_high": 0.2}, {"loss_type": "dual_clip"})
    # off-policy with a cap c = 1.05 that surely binds: gradients differ from plain PPO; with c = 1e6 they match
    _, g_ppo = off_policy_loss_and_grads(tmp_path / "c", peft, loss_type="dapo", epsilon_high=0.2)
    _, g_loose = off_policy_loss_and_grads(tmp_path / "d", peft, loss_type="dual_clip", dual_clip_c=1e6)
    for k in g_ppo:
        torch.testing.assert_close(g_ppo[k], g_loose[k], atol=1e-6, rtol=1e-5)
    tight = ours(tmp_path / "e", peft, loss_type="dual_clip", dual_clip_c=1.05)
    _, g_tight = loss_and_grads(tight, off_policy_batch(tight))
    assert grads_differ(g_ppo, g_tight, atol=1e-7)


def test_dual_clip_caps_exactly_the_negative_tokens_above_c(tmp_path):
    # per-token check from the trainer's own inputs: loss = Σ l·m / #tokens with l from the formula
    trainer = ours(tmp_path, loss_type="dual_clip", dual_clip_c=1.05)
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    logps = current_logps(trainer, inputs)
    ratio = torch.exp(logps - inputs["old_per_token_logps"])
    adv, mask = inputs["advantages"].unsqueeze(1), inputs["completion_mask"]
    ppo = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    capped = (adv < 0) & (ratio > 1.05) & (mask > 0)
    assert capped.any()  # the perturbation moves some negative tokens past the cap
    expected = (torch.where(adv < 0, torch.minimum(ppo, -adv * 1.05), ppo) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_dual_clip_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="dual_clip", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_dual_clip_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="dual_clip"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="dual_clip", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
