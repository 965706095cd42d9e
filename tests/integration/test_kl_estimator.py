"""`kl_estimator`: a real off-policy step on the tiny model. The routed path reproduces TRL with k3, and each other
estimator changes the loss by exactly β·aggregate(k − k3)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ
from tests.integration.test_variant_training import _off_policy_step
from trl_groupx.objective import aggregate, per_token_kl


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_routed_trl_loss_with_k3_equals_trl(tmp_path, peft):
    _, g_trl = _off_policy_step(ours(tmp_path / "a", peft, loss_type="grpo", beta=0.04))
    trainer = ours(tmp_path / "b", peft, loss_type="grpo", beta=0.04, kl_estimator="k2")
    assert trainer._reference_objective.id == "dapo"  # TRL's clipped surrogate, our reference
    trainer._kl_estimator = "k3"
    _, g_routed = _off_policy_step(trainer)
    for k in g_trl:
        torch.testing.assert_close(g_routed[k], g_trl[k], atol=1e-6, rtol=1e-5)


def _perturbed_inputs(trainer, seed=0):
    """Inputs sampled by the tiny model, then the trainable weights moved (ratios and KL ≠ 0), as in
    `_off_policy_step`."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(seed)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(seed)
    inputs = trainer._prepare_inputs(batch)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, inputs["completion_ids"].size(1))
        gen = torch.Generator().manual_seed(1)
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, inputs["completion_ids"].size(1))
    return {**inputs, "old_per_token_logps": old}, logps


def _loss_and_grads(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("estimator", ["k1", "k2", "abs"])
@pytest.mark.parametrize("loss_type", ["grpo", "gmpo"])
def test_estimator_changes_loss_by_beta_times_kl_difference(tmp_path, estimator, loss_type):
    beta = 0.5
    trainer = ours(tmp_path, loss_type=loss_type, beta=beta, kl_estimator=estimator)
    inputs, logps = _perturbed_inputs(trainer)
    loss_k, g_k = _loss_and_grads(trainer, inputs)
    trainer._kl_estimator = "k3"
    loss_k3, g_k3 = _loss_and_grads(trainer, inputs)
    ref, mask = inputs["ref_per_token_logps"], inputs["completion_mask"]
    diff = per_token_kl(logps, ref, estimator) - per_token_kl(logps, ref, "k3")
    assert trainer.args.use_bias_correction_kl  # TRL 1.16's default: the estimate is importance-weighted by π/π_old
    diff = diff * torch.exp(logps - inputs["old_per_token_logps"])
    expected = loss_k3 + beta * aggregate(diff, mask, "sequence_mean")
    torch.testing.assert_close(loss_k, expected, atol=1e-6, rtol=1e-5)
    assert grads_differ(g_k3, g_k, atol=1e-6)
