"""`kl_estimator`: a real off-policy step on the tiny model. The routed path reproduces TRL with k3, and each other
estimator changes the loss by exactly β·aggregate(k − k3)."""

import pytest
import torch

from tests.conftest import grads_differ
from tests.integration.objective_helpers import current_logps, loss_and_grads, off_policy_batch, ours
from tests.integration.test_variant_training import _off_policy_step
from trl_groupx.objective import aggregate, per_token_kl


@pytest.mark.parametrize("peft", [False, True])
def test_routed_trl_loss_with_k3_equals_trl(tmp_path, peft):
    _, g_trl = _off_policy_step(ours(tmp_path / "a", peft, loss_type="grpo", beta=0.04))
    trainer = ours(tmp_path / "b", peft, loss_type="grpo", beta=0.04, kl_estimator="k2")
    assert trainer._reference_objective.id == "dapo"  # TRL's clipped surrogate, our reference
    trainer._kl_estimator = "k3"
    _, g_routed = _off_policy_step(trainer)
    for k in g_trl:
        torch.testing.assert_close(g_routed[k], g_trl[k], atol=1e-6, rtol=1e-5)


def _perturbed_inputs(trainer):
    """Inputs sampled by the tiny model, then the trainable weights moved (ratios and KL ≠ 0); with the current
    log-probs."""
    inputs = off_policy_batch(trainer)
    return inputs, current_logps(trainer, inputs)


@pytest.mark.parametrize("estimator", ["k1", "k2", "abs"])
@pytest.mark.parametrize("loss_type", ["grpo", "gmpo"])
def test_estimator_changes_loss_by_beta_times_kl_difference(tmp_path, estimator, loss_type):
    beta = 0.5
    trainer = ours(tmp_path, loss_type=loss_type, beta=beta, kl_estimator=estimator)
    inputs, logps = _perturbed_inputs(trainer)
    loss_k, g_k = loss_and_grads(trainer, inputs)
    trainer._kl_estimator = "k3"
    loss_k3, g_k3 = loss_and_grads(trainer, inputs)
    ref, mask = inputs["ref_per_token_logps"], inputs["completion_mask"]
    diff = per_token_kl(logps, ref, estimator) - per_token_kl(logps, ref, "k3")
    assert trainer.args.use_bias_correction_kl  # TRL 1.16's default: the estimate is importance-weighted by π/π_old
    diff = diff * torch.exp(logps - inputs["old_per_token_logps"])
    expected = loss_k3 + beta * aggregate(diff, mask, "sequence_mean")
    torch.testing.assert_close(loss_k, expected, atol=1e-6, rtol=1e-5)
    assert grads_differ(g_k3, g_k, atol=1e-6)


# ---- beta_negative (MDP-GRPO's asymmetric KL) -------------------------------------------------------------------

@pytest.mark.parametrize("peft", [False, True])
def test_beta_negative_equal_to_beta_is_trl(tmp_path, peft):
    _, g_trl = _off_policy_step(ours(tmp_path / "a", peft, loss_type="grpo", beta=0.04))
    trainer = ours(tmp_path / "b", peft, loss_type="grpo", beta=0.04, beta_negative=0.04)
    assert trainer._reference_objective.id == "dapo"
    _, g_routed = _off_policy_step(trainer)
    for k in g_trl:
        torch.testing.assert_close(g_routed[k], g_trl[k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("loss_type", ["grpo", "gmpo"])
def test_beta_negative_adds_its_excess_on_negative_advantage_rows(tmp_path, loss_type):
    beta, beta_negative = 0.1, 0.7
    trainer = ours(tmp_path, loss_type=loss_type, beta=beta, beta_negative=beta_negative)
    inputs, logps = _perturbed_inputs(trainer)
    loss_asym, g_asym = loss_and_grads(trainer, inputs)
    trainer._beta_negative = None
    loss_sym, g_sym = loss_and_grads(trainer, inputs)
    ref, mask = inputs["ref_per_token_logps"], inputs["completion_mask"]
    kl = per_token_kl(logps, ref, "k3") * torch.exp(logps - inputs["old_per_token_logps"])  # bias-corrected, as TRL
    negative = (inputs["advantages"] < 0).float().unsqueeze(1)
    assert 0 < negative.sum() < negative.numel()  # both signs in the batch
    expected = loss_sym + (beta_negative - beta) * aggregate(kl * negative, mask, "sequence_mean")
    torch.testing.assert_close(loss_asym, expected, atol=1e-6, rtol=1e-5)
    assert grads_differ(g_sym, g_asym, atol=1e-7)
