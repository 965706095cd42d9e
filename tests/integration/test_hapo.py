"""HAPO token-weight parts on the tiny model: one real step, full and LoRA.

The token-weight stage's inputs are recorded at the trainer's call (global batch in group order; TRL shuffles the
rows afterwards), its output is checked against a loop-based reference written from the docstring's formulas, the
trained rows are matched back to it, and the gradient differs from plain GRPO (DAPO loss) on the same batch.
Composition: CISPO objective.
"""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def record_token_stage(trainer):
    seen = {}
    original = trainer._call

    def spy(variant, *args, **extra):
        out = original(variant, *args, **extra)
        if variant.stage == "token_weights":
            seen.update(advantages=args[0], ctx=args[1], out=out)
        return out

    trainer._call = spy
    return seen


def reference(rewards, mask, entropies, group_size, beta=1.0, pivot=0.8, threshold=5.0, fallback=None):
    """Plain-loop TLGA + DAR (ratio 1), paper sign."""
    n, t = mask.shape
    seq = [0.0] * n
    for g in range(0, n, group_size):
        rows = [i for i in range(g, g + group_size) if not math.isnan(rewards[i]) and mask[i].sum() > 0]
        tokens = [(float(rewards[i]), int(mask[i].sum())) for i in rows]
        total = sum(length for _, length in tokens)
        if total == 0:
            continue
        mu = sum(r * length for r, length in tokens) / total
        sd = math.sqrt(sum(length * (r - mu) ** 2 for r, length in tokens) / total)
        normed = {i: (float(rewards[i]) - mu) / (sd + 1e-6) for i in rows}
        for i in rows:
            seq[i] = float(fallback[i]) if any(abs(v) >= threshold for v in normed.values()) else normed[i]
    ell = [math.log(max(float(entropies[i, j]), 1e-8)) for i in range(n) for j in range(t) if mask[i, j]]
    ordered = sorted(ell)
    m = ordered[round(pivot * (len(ordered) - 1))]
    out = torch.zeros(n, t)
    dev = {(i, j): math.log(max(float(entropies[i, j]), 1e-8)) - m for i in range(n) for j in range(t) if mask[i, j]}
    top, bottom = max(max(dev.values()), 1e-12), max(-min(dev.values()), 1e-12)
    for (i, j), d in dev.items():
        h_hat = d / top if d > 0 else d / bottom
        out[i, j] = seq[i] * (1 + beta * h_hat) if h_hat <= 0 else seq[i]
    return out


@pytest.mark.parametrize("peft", [False, True])
def test_hapo_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "hapo", peft, loss_type="dapo", token_weighting="hapo")
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same order
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == mask.shape and (adv[mask == 0] == 0).all() and torch.isfinite(adv).all()
    ctx, out = seen["ctx"], seen["out"]
    expected = reference(ctx.rewards, ctx.completion_mask, ctx.entropies, 4, fallback=seen["advantages"])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # every trained row is one of the stage's rows (TRL shuffled them), with the same completion
    for ids, row in zip(inputs["completion_ids"], adv):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    # DAR moved some tokens away from the (token-level) group-average advantage
    assert any(len(set(r[m.bool()].tolist())) > 1 for r, m in zip(out, ctx.completion_mask) if r.abs().sum() > 0)
    assert grads_differ(base_grads, grads)


def test_hapo_composes_with_cispo(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="cispo"))
    loss, grads, inputs = one_step(ours(tmp_path / "hapo", loss_type="cispo", token_weighting="hapo"))
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
