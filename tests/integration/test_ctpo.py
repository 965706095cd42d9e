"""CTPO on the tiny model: GRPO on-policy; off-policy the cumulative ratio and position clip change the gradient;
full and LoRA; exact loss from the trainer's own inputs; split invariance; composition with an advantage variant."""

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
def test_ctpo_on_and_off_policy(tmp_path, peft):
    # on-policy ρ = 1 (cumulative too): nothing clipped → the same gradient as dapo's token-mean clipped surrogate
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "dapo", "epsilon_high": 0.2}, {"loss_type": "ctpo"})
    # off-policy: PPO's token ratio vs CTPO's cumulative ratio with its position-adaptive window
    _, g_ppo = off_policy_loss_and_grads(tmp_path / "c", peft, loss_type="dapo", epsilon_high=0.2)
    _, g_off = off_policy_loss_and_grads(tmp_path / "d", peft, loss_type="ctpo")
    assert grads_differ(g_ppo, g_off, atol=1e-7)
    assert all(torch.isfinite(g).all() for g in g_off.values())


def test_ctpo_loss_from_the_trainers_inputs(tmp_path):
    # loss = Σ l·m / #tokens with l from the formula: cumulative log-ratio, √t window, cap e^{.05√t} for A < 0
    trainer = ours(tmp_path, loss_type="ctpo")
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    logps = current_logps(trainer, inputs)
    adv, mask = inputs["advantages"].unsqueeze(1), inputs["completion_mask"].float()
    d = (logps - inputs["old_per_token_logps"]).clamp(-20, 20) * mask
    L = d.cumsum(-1).clamp(max=10.0)
    s = mask.cumsum(-1).clamp(min=1).sqrt()
    ratio, clipped = L.exp(), torch.clamp(L, -0.025 * s, 0.05 * s).exp()
    ppo = torch.maximum(-adv * ratio, -adv * clipped)
    per_token = torch.where(adv < 0, torch.minimum(ppo, -adv * (0.05 * s).exp()), ppo)
    assert ((L.abs() > 0.05 * s) & (mask > 0)).any()  # the perturbation puts some tokens outside the window
    expected = (per_token * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_ctpo_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="ctpo", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_ctpo_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="ctpo"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="ctpo", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
