"""Advantage Reweighting (lopti) on the tiny model: one real step, full and LoRA; the stage's output equals
(0.3·π_old + 0.7)·A on the recorded global batch, the trained rows are those rows (TRL shuffles), and the gradient
differs from plain GRPO on the same batch. Composition: loss_type="grpo" (sequence-mean objective)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_lopti_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "lopti", peft, loss_type="dapo", token_weighting="lopti")
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    ctx, out, seq = seen["ctx"], seen["out"], seen["advantages"]
    m = ctx.completion_mask.bool()
    expected = torch.where(m, (0.3 * ctx.logps.exp() + 0.7) * seq[:, None], torch.zeros_like(out))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert ((out.abs() < seq.abs()[:, None]) & m).any()  # some token had p < 1 and a nonzero advantage
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_lopti_composes_with_grpo_loss(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="grpo"))
    loss, grads, inputs = one_step(ours(tmp_path / "lopti", loss_type="grpo", token_weighting="lopti"))
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
