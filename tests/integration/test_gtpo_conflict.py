"""GTPO conflict tokens on the tiny model: one real step, full and LoRA; the stage's output is checked against a
loop-based reference on the recorded global batch, the trained rows are those rows (TRL shuffles), and the
gradient differs from plain GRPO on the same batch. The tiny model's mean entropies (~1.5-4 nats) are all above
the paper's 0.7, which would drop every completion; the step uses a 10-nat cut-off. Composition: DAPO loss."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage

FLAGS = dict(token_weighting="gtpo_conflict", gtpo_conflict_entropy_max=10.0, scale_rewards="none")


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def reference(adv, ids, mask, ent, g, w=2.0, h_max=10.0, c=0.1):
    """Plain loops over groups, rows and positions."""
    n, t = ids.shape
    lengths = [int(mask[i].sum()) for i in range(n)]
    out = torch.zeros(n, t)
    for i in range(n):
        lo = (i // g) * g
        members = range(lo, lo + g)
        if adv[i] == 0 or lengths[i] == 0:
            conflicts = set()
        else:
            def shares(j_pos, j_tok, from_end, i=i, members=members):
                tok = ids[i, j_tok]
                found = {1: False, -1: False}
                for k in members:
                    if adv[k] == 0:
                        continue
                    kt = lengths[k] - 1 - j_pos if from_end else j_pos
                    if 0 <= kt < lengths[k] and ids[k, kt] == tok:
                        found[1 if adv[k] > 0 else -1] = True
                return found[1] and found[-1]
            conflicts = set()
            for p in range(lengths[i]):  # prefix run
                if not shares(p, p, False):
                    break
                conflicts.add(p)
            for s in range(lengths[i]):  # suffix run
                if not shares(s, lengths[i] - 1 - s, True):
                    break
                conflicts.add(lengths[i] - 1 - s)
        mean_h = float(sum(ent[i, :lengths[i]])) / max(lengths[i], 1)
        shaped = (float(adv[i]) - c * mean_h) if mean_h <= h_max else 0.0
        shaped /= max(len(conflicts), 1)
        for p in range(lengths[i]):
            delta = (w if adv[i] > 0 else 0.0) if p in conflicts else 1.0
            out[i, p] = shaped * delta
    return out


@pytest.mark.parametrize("peft", [False, True])
def test_gtpo_conflict_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo", scale_rewards="none"))
    trainer = ours(tmp_path / "gtpo", peft, loss_type="grpo", **FLAGS)
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    ctx, out, seq = seen["ctx"], seen["out"], seen["advantages"]
    expected = reference(seq, ctx.completion_ids, ctx.completion_mask, ctx.entropies, 4)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_gtpo_conflict_composes_with_dapo(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="dapo", scale_rewards="none"))
    loss, grads, inputs = one_step(ours(tmp_path / "gtpo", loss_type="dapo", **FLAGS))
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
