"""KL-Cov on the tiny model: GRPO's gradient on-policy, penalty off-policy; full and LoRA; split invariance."""

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
def test_kl_cov_on_and_off_policy(tmp_path, peft):
    # on-policy: |log ρ| = 0 with zero gradient → the token-mean policy gradient, i.e. dapo's at ρ = 1
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "dapo"}, {"loss_type": "kl_cov"})
    # off-policy: coefficient 0 is the unclipped surrogate; the penalty (all tokens selected) changes the gradient
    loss_free, g_free = off_policy_loss_and_grads(tmp_path / "c", peft, loss_type="kl_cov", kl_cov_coef=0.0)
    loss_pen, g_pen = off_policy_loss_and_grads(tmp_path / "d", peft, loss_type="kl_cov", kl_cov_ratio=1.0)
    assert loss_pen > loss_free and grads_differ(g_free, g_pen, atol=1e-7)


def test_kl_cov_loss_from_trainer_inputs(tmp_path):
    # every token selected (ratio 1): loss = Σ (-Aρ + |log ρ|) m / #tokens, computed from the trainer's inputs
    trainer = ours(tmp_path, loss_type="kl_cov", kl_cov_ratio=1.0)
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    logps = current_logps(trainer, inputs)
    lr, mask, adv = logps - inputs["old_per_token_logps"], inputs["completion_mask"], inputs["advantages"].unsqueeze(1)
    expected = ((-adv * lr.exp() + lr.abs()) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_kl_cov_loss_scale_independent_of_accumulation_split(tmp_path):
    # ratio 1 selects every token in any micro-batch, so the selection is split-invariant too
    trainer = ours(tmp_path, loss_type="kl_cov", kl_cov_ratio=1.0, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_kl_cov_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="kl_cov"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="kl_cov", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
