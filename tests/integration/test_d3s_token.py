"""D³S token level on the tiny model: one real step, full and LoRA. At step 0 of 1 the keep ratio is the start value: the
recorded stage output keeps ⌈ρM⌉ real tokens (ρ = 0.25 here, so that the selection bites among the tokens
with a nonzero advantage: the tiny batch has several all-equal groups), the highest |A|·H ones, scaled by M/k; the trained rows are
those rows (TRL shuffles); the gradient differs from plain GRPO. Compositions: sequence-mean loss ("grpo") and the
full D³S (sample level `rollout_filter="d3s"` + token level)."""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_d3s_token_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "d3s", peft, loss_type="dapo", token_weighting="d3s_token", d3s_token_keep_start=0.25)
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    ctx, out, seq = seen["ctx"], seen["out"], seen["advantages"]
    mask = ctx.completion_mask.bool()
    m = int(mask.sum())
    k = math.ceil(0.25 * m)
    score = seq.abs()[:, None] * ctx.entropies
    full = seq[:, None].expand_as(out)
    kept = mask & (out != 0)
    nonzero_adv = mask & (full != 0)
    assert int(kept.sum()) <= k and int((nonzero_adv & ~kept).sum()) > 0
    torch.testing.assert_close(out[kept], (m / k) * full[kept])
    dropped = nonzero_adv & ~kept
    assert score[kept].min() >= score[dropped].max()  # the kept ones are the top |A|·H tokens
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_d3s_token_composes_with_sequence_mean_loss(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="grpo"))
    loss, grads, inputs = one_step(ours(tmp_path / "d3s", loss_type="grpo", token_weighting="d3s_token",
                                        d3s_token_renormalize="sequence", d3s_token_keep_start=0.25))
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)


def test_full_d3s_sample_and_token_level(tmp_path):
    loss, grads, inputs = one_step(ours(tmp_path / "d3s", loss_type="dapo", token_weighting="d3s_token",
                                        rollout_filter="d3s"))
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all() and grads
