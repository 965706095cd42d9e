"""FiberPO on the tiny model: TRL's GRPO step on-policy; off-policy (ratios ≠ 1) the trajectory and fibre gates change
the gradient; full and LoRA; exact loss from the trainer's own inputs; split invariance; composition with an
advantage variant."""

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
def test_fiberpo_on_and_off_policy(tmp_path, peft):
    # on-policy every ratio is 1 and nothing is gated: the vanilla policy gradient, i.e. TRL's GRPO step
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "grpo"}, {"loss_type": "fiberpo"})
    # off-policy: PPO's token clip vs FiberPO's trajectory/fibre gates on the same batch
    _, g_ppo = off_policy_loss_and_grads(tmp_path / "c", peft, loss_type="grpo")
    _, g_off = off_policy_loss_and_grads(tmp_path / "d", peft, loss_type="fiberpo")
    assert grads_differ(g_ppo, g_off, atol=1e-7)
    assert all(torch.isfinite(g).all() for g in g_off.values())


def test_fiberpo_loss_from_the_trainers_inputs(tmp_path):
    # loss = mean_i (1/|o_i|) Σ_t -A_i ρ_it, ρ from the formula written out independently here
    trainer = ours(tmp_path, loss_type="fiberpo")
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    logps = current_logps(trainer, inputs)
    adv, mask = inputs["advantages"].unsqueeze(1), inputs["completion_mask"].float()
    eps, c_pos, c_neg = 0.05, 0.28, 0.2
    rows, censored, gated = [], 0, 0
    for i in range(mask.size(0)):
        keep = mask[i] > 0
        lr = (logps[i] - inputs["old_per_token_logps"][i]).clamp(-20, 20)[keep]
        up = lr > 0
        mu_up = lr[up].mean() if up.any() else torch.tensor(0.0)
        mu_down = (-lr[~up]).mean() if (~up).any() else torch.tensor(0.0)
        resid = torch.where(up, lr - mu_up, lr + mu_down)
        censored += int((resid.abs() > eps).sum())
        a = adv[i, 0]
        base = -2 * max(mu_up - c_pos, 0.0) if a > 0 else (2 * max(mu_down - c_neg, 0.0) if a < 0 else 0.0)
        gated += int(base != 0.0)
        rho = torch.exp(lr + base + resid.clamp(-eps, eps) - resid)
        rows.append((-a * rho).mean() if keep.any() else torch.tensor(0.0))
    assert censored > 0  # the perturbation moves some tokens outside the fibre band
    assert gated > 0  # and some trajectories beyond their budget (rollback zone)
    torch.testing.assert_close(loss, torch.stack(rows).mean(), atol=1e-6, rtol=1e-5)


def test_fiberpo_real_steps_with_two_iterations_differ_from_grpo(tmp_path):
    # Trainer.train with num_iterations=2: the first step is on-policy (FiberPO = GRPO), the second reuses the batch
    # off-policy, where the gates act, so the weights end up elsewhere than GRPO's
    def trained(path, loss_type, steps=2):
        trainer = ours(path, loss_type=loss_type, num_iterations=2, max_steps=steps, learning_rate=0.05)
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    assert not grads_differ(trained(tmp_path / "c", "grpo", 1), trained(tmp_path / "d", "fiberpo", 1), atol=1e-7)
    grpo, fiber = trained(tmp_path / "a", "grpo"), trained(tmp_path / "b", "fiberpo")
    assert all(torch.isfinite(p).all() for p in fiber.values())
    assert grads_differ(grpo, fiber, atol=1e-7)


def test_fiberpo_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="fiberpo", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_fiberpo_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="fiberpo"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="fiberpo", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
