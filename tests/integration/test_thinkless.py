"""Thinkless / DeGRPO on the tiny model: gradient differs from GRPO (full and LoRA), exact loss from the trainer's
own inputs in both normalisations, split invariance of the paper form, composition with an advantage variant."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import (
    assert_split_invariant,
    current_logps,
    loss_and_grads,
    off_policy_batch,
    ours,
)


def ppo_token_loss(trainer, inputs):
    logps = current_logps(trainer, inputs)
    adv = inputs["advantages"].unsqueeze(1)
    ratio = (logps - inputs["old_per_token_logps"]).exp()
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)), inputs["completion_mask"].float()


@pytest.mark.parametrize("peft", [False, True])
def test_thinkless_changes_the_gradient(tmp_path, peft):
    _, g_grpo, _ = one_step(ours(tmp_path / "a", peft, loss_type="grpo"))
    _, g_think, _ = one_step(ours(tmp_path / "b", peft, loss_type="thinkless"))
    assert grads_differ(g_grpo, g_think)
    assert all(torch.isfinite(g).all() for g in g_think.values())
    # α = 0 on policy with all-active first tokens: GRPO on the response tokens only — still not GRPO
    _, g_zero, _ = one_step(ours(tmp_path / "c", peft, loss_type="thinkless", thinkless_alpha=0.0))
    assert grads_differ(g_think, g_zero)


def test_thinkless_paper_loss_from_the_trainers_inputs(tmp_path):
    # loss = mean_i [α ℓ_i0 + (1/|y_i|) Σ_{t≥1} ℓ_it] with PPO's clipped token loss, off-policy
    trainer = ours(tmp_path, loss_type="thinkless", thinkless_alpha=0.3)
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    ell, mask = ppo_token_loss(trainer, inputs)
    response = mask.clone()
    response[:, 0] = 0
    rows = 0.3 * ell[:, 0] * mask[:, 0] + (ell * response).sum(-1) / response.sum(-1).clamp(min=1)
    torch.testing.assert_close(loss, rows.mean(), atol=1e-6, rtol=1e-5)


def test_thinkless_official_loss_from_the_trainers_inputs(tmp_path):
    # official (token_mean): α masked_mean(ℓ, control) + masked_mean(ℓ, response) over the micro-batch
    trainer = ours(tmp_path, loss_type="thinkless", thinkless_alpha=0.3, loss_aggregation="token_mean")
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    ell, mask = ppo_token_loss(trainer, inputs)
    control = torch.zeros_like(mask)
    control[:, 0] = mask[:, 0]
    response = mask - control
    expected = 0.3 * (ell * control).sum() / control.sum() + (ell * response).sum() / response.sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_thinkless_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="thinkless", thinkless_alpha=0.5, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_thinkless_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="thinkless"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="thinkless", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
