"""FRPO on the tiny model: the reference is the LoRA base (beta = 0) or TRL's reference model (beta > 0); the
trained token advantages are A − β·(future k1 KL); full fine-tuning with beta = 0 is refused at construction."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _perturb_adapter(trainer):
    # a fresh LoRA adapter equals its base (B = 0): move it so that policy and reference differ
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def test_lora_base_is_the_reference_and_gradient_changes(tmp_path):
    base = ours(tmp_path / "a", True, loss_type="grpo")
    _perturb_adapter(base)
    _, g_base, _ = one_step(base)
    trainer = ours(tmp_path / "b", True, loss_type="grpo", token_weighting="frpo", frpo_beta=1.0)
    _perturb_adapter(trainer)
    _, grads, inputs = one_step(trainer)
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == mask.shape and (adv[mask == 0] == 0).all()
    # recompute: A − β Σ_{j≥t} (logπ_old − logπ_ref) on the trained (shuffled) rows
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], mask], 1)
    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, mask.size(1))
        with trainer.model.disable_adapter():
            ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, mask.size(1))
    future = ((old - ref) * mask).flip(-1).cumsum(-1).flip(-1)
    seq_adv = (adv[:, 0] + future[:, 0])  # A_i recovered from the first token
    torch.testing.assert_close(adv, (seq_adv[:, None] - future) * mask, atol=1e-5, rtol=1e-5)
    assert future.abs().max() > 1e-3  # the correction is not trivially zero
    assert grads_differ(g_base, grads)


def test_full_finetuning_with_beta_zero_is_refused(tmp_path):
    with pytest.raises(ValueError, match="token_weighting='frpo' needs reference log-probs.*LoRA.*beta > 0"):
        ours(tmp_path, token_weighting="frpo")


def test_full_finetuning_with_trl_reference(tmp_path):
    trainer = ours(tmp_path, token_weighting="frpo", beta=0.04, loss_type="cispo")
    loss, grads, inputs = one_step(trainer)
    assert inputs["advantages"].dim() == 2 and torch.isfinite(loss)
    assert any(g.abs().sum() > 0 for g in grads.values())
