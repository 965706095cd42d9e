"""DRO on the tiny model: GPG's (REINFORCE) gradient on-policy, the quadratic log-ratio penalty off-policy; the loss
recomputed from the trainer's inputs; full and LoRA; split invariance; a composition."""

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

DRO = {"loss_type": "dro", "dro_beta": 0.05, "loss_aggregation": "global_token_mean"}


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_on_policy_is_reinforce_and_off_policy_the_penalty_acts(tmp_path, peft):
    # on-policy the penalty and its gradient vanish: -A ∇logp, GPG's surrogate on the same (GRPO) advantages
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "gpg", "scale_rewards": "group"}, DRO)
    # off-policy: β changes the gradient (β (logp - logp_old) ∇logp)
    _, g_small = off_policy_loss_and_grads(tmp_path / "small", peft, **{**DRO, "dro_beta": 1e-6})
    _, g_large = off_policy_loss_and_grads(tmp_path / "large", peft, **{**DRO, "dro_beta": 50.0})
    assert grads_differ(g_small, g_large, atol=1e-7)


def test_loss_from_trainer_inputs(tmp_path):
    # loss = Σ -(A·logp - β/2 (logp - old)²)·m / Σ m  (global token mean, one micro-batch)
    trainer = ours(tmp_path, **{**DRO, "dro_beta": 2.0})
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    lp = current_logps(trainer, inputs)
    old, mask, adv = inputs["old_per_token_logps"], inputs["completion_mask"], inputs["advantages"].unsqueeze(1)
    assert ((lp - old).abs() * mask).sum() > 0  # off-policy: the penalty is not zero here
    expected = (-(adv * lp - 1.0 * (lp - old) ** 2) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_loss_scale_independent_of_accumulation_split(tmp_path):
    assert_split_invariant(ours(tmp_path, **DRO, per_device_train_batch_size=4, gradient_accumulation_steps=2))


def test_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", **DRO))
    _, grads, inputs = one_step(ours(tmp_path / "b", **DRO, advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
