"""One real step per variant on the shipped tiny model (full and LoRA): the flag changes the gradient, and by
exactly what its formula says where that can be checked from the trainer's inputs."""

import dataclasses

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.objective import TRL_LOSS_AGGREGATION

PEFT = [False, True]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", PEFT)
def test_sign_adv_changes_gradient_and_uses_2r_minus_1(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "sign", peft, loss_type="grpo", advantage_estimator="sign_adv")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert sorted(inputs["advantages"].tolist()) == sorted((2 * rewards - 1).tolist())
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("peft", PEFT)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_gtpo_entropy_gives_token_advantages_and_changes_gradient(tmp_path, peft, level):
    _, base_grads, _ = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "gtpo", peft, loss_type="grpo", token_weighting="gtpo_entropy", gtpo_level=level)
    _, grads, inputs = one_step(trainer)
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == inputs["completion_ids"].shape
    assert (adv[mask == 0] == 0).all() and torch.isfinite(adv).all()
    if level == "token":
        # tokens of one completion get different credit (entropy-shaped), unlike GRPO's broadcast
        assert any(len(set(a[m.bool()].tolist())) > 1 for a, m in zip(adv, mask))
    else:
        assert all(len(set(a[m.bool()].tolist())) <= 1 for a, m in zip(adv, mask))
    assert grads_differ(base_grads, grads)


def _off_policy_step(trainer, seed=0):
    """One step where the policy has moved since sampling (ratios ≠ 1): old log-probs are taken, then the
    trainable weights are perturbed the same way for every trainer built from the same model."""
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
    inputs = {**inputs, "old_per_token_logps": old}
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("peft", PEFT)
def test_gmpo_equals_grpo_on_policy_and_differs_off_policy(tmp_path, peft):
    # On-policy (ratio 1) the geometric and arithmetic means coincide: same gradient as GRPO's sequence mean.
    _, g_grpo, _ = one_step(ours(tmp_path / "a", peft, loss_type="grpo"))
    _, g_gmpo, _ = one_step(ours(tmp_path / "b", peft, loss_type="gmpo"))
    for k in g_grpo:
        torch.testing.assert_close(g_grpo[k], g_gmpo[k], atol=1e-6, rtol=1e-5)
    # Off-policy they differ.
    _, o_grpo = _off_policy_step(ours(tmp_path / "c", peft, loss_type="grpo"))
    _, o_gmpo = _off_policy_step(ours(tmp_path / "d", peft, loss_type="gmpo"))
    assert grads_differ(o_grpo, o_gmpo, atol=1e-6)


def test_gmpo_with_kl_uses_reference(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", beta=0.04)
    _, grads = _off_policy_step(trainer)
    assert trainer._metrics["train"]["kl"][-1] > 0  # the perturbed policy has moved away from the reference
    assert all(torch.isfinite(g).all() for g in grads.values())


NATIVE = [("grpo", "token", "dapo"), ("bnpo", "token", "dapo"), ("dr_grpo", "token", "dr_grpo"),
          ("dapo", "token", "dapo"), ("cispo", "token", "cispo"), ("sapo", "token", "sapo"),
          ("grpo", "sequence", "gspo")]


@pytest.mark.parametrize("loss_type, level, variant_id", NATIVE)
def test_objective_seam_reproduces_trl_losses(tmp_path, loss_type, level, variant_id):
    """Our objective path (surrogate fn + masks + aggregation) run with the pure references of TRL's loss types
    gives TRL's own loss and gradients: the seam loses nothing TRL applies."""
    trainer = ours(tmp_path, loss_type=loss_type, importance_sampling_level=level, beta=0.04, epsilon_high=0.28)
    loss_trl, grads_trl = _off_policy_step(trainer)
    variant = trl_groupx.get_variant(variant_id)
    variant = dataclasses.replace(variant, flags={**variant.flags, "loss_aggregation": TRL_LOSS_AGGREGATION[loss_type]})
    trainer2 = ours(tmp_path / "2", loss_type=loss_type, importance_sampling_level=level, beta=0.04, epsilon_high=0.28)
    trainer2.compute_loss_orig = trainer2._compute_loss
    trainer2._compute_loss = lambda model, inputs: trainer2.compute_objective_loss(model, inputs, variant)
    loss_ours, grads_ours = _off_policy_step(trainer2)
    torch.testing.assert_close(loss_ours, loss_trl, atol=1e-6, rtol=1e-6)
    for k in grads_trl:
        torch.testing.assert_close(grads_ours[k], grads_trl[k], atol=1e-6, rtol=1e-5)
