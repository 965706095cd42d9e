"""Temporal credit (RLVR-Schedule suffix curriculum) on the tiny model: one real step, full and LoRA.

At step 0 with the official magnitude 0.99 each completion keeps only its suffix from P = min(⌊0.99·L⌋, L − 1):
the recorded stage output is exactly the sequence advantage on t ≥ P and 0 elsewhere; the trained rows are those
rows (TRL shuffles); the gradient differs from plain GRPO. Composition: with a sequence-mean loss ("grpo") and
unscaled (Dr. GRPO-style) advantages, scale_rewards="none", and the sigmoid schedule."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_temporal_credit_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "tc", peft, loss_type="dapo", token_weighting="temporal_credit")
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    ctx, out, seq = seen["ctx"], seen["out"], seen["advantages"]
    mask = ctx.completion_mask.bool()
    lengths = mask.sum(-1)
    expected = torch.zeros_like(out)
    for i, length in enumerate(lengths.tolist()):
        p = min(int(length * 0.99), length - 1) if length > 0 else 0
        expected[i, p:length] = seq[i]
    torch.testing.assert_close(out, expected)
    assert int((out != 0).sum()) < int((mask & (seq[:, None] != 0)).sum())  # the schedule bites
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_temporal_credit_composes_with_sequence_mean_loss(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="grpo", scale_rewards="none"))
    loss, grads, inputs = one_step(ours(tmp_path / "tc", loss_type="grpo", scale_rewards="none",
                                        token_weighting="temporal_credit", temporal_credit_schedule="sigmoid"))
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
