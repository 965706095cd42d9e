"""OTB (token_weighting="otb") on the tiny model.

- The Σπ² forward (`token_weights/sum_pi_squared.py`) gives TRL's own log-probs and entropies (TRL's fused LM
  head, `_get_per_token_logps_and_entropies`) to 1e-6 on a real generated batch at temperature 0.7, and Σπ²
  equal to a direct softmax of the model's temperature-scaled logits; padding is 0.
- One real step, full and LoRA: the trainer fills `ctx.sum_pi_squared`, the stage's output equals OTB recomputed
  by hand (a loop) from the recorded context, the trained rows are those rows (TRL shuffles), and the gradient
  differs from plain GRPO on the same batch.
- Composition: a sampling filter (dropped rollouts arrive as NaN rewards) and loss_type="grpo".
"""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage
from trl_groupx.token_weights.sum_pi_squared import per_token_logps_entropies_sum_pi_squared


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def otb_loop(rewards, logps, s2, mask, group_size):
    """OTB by hand, one group and one position at a time (docstring of otb_token_advantages)."""
    n, t_len = mask.shape
    out = torch.zeros(n, t_len, dtype=torch.float64)
    w_cum = torch.zeros(n, t_len, dtype=torch.float64)
    for i in range(n):
        acc = 0.0
        for t in range(t_len):
            if mask[i, t] and not torch.isnan(rewards[i]):
                acc += 1.0 - 2.0 * float(logps[i, t].exp()) + float(s2[i, t])
            w_cum[i, t] = acc
    for g in range(0, n, group_size):
        members = [i for i in range(g, g + group_size) if not torch.isnan(rewards[i])]
        for t in range(t_len):
            real = [i for i in members if mask[i, t]]
            num = sum(float(rewards[i]) * float(w_cum[i, t]) for i in real)
            den = sum(float(w_cum[i, t]) for i in real) + 1e-8
            for i in real:
                out[i, t] = float(rewards[i]) - (num / den if group_size > 1 else 0.0)
    return out.float()


def _batch_inputs(trainer):
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    return trainer._prepare_inputs(batch)


def test_sum_pi_squared_forward_matches_trl(tmp_path):
    trainer = ours(tmp_path, token_weighting="otb", temperature=0.7)
    inputs = _batch_inputs(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    k = inputs["completion_ids"].size(1)
    assert (inputs["completion_mask"] == 0).any()  # the batch has completion padding
    with torch.no_grad():
        trl_logps, trl_ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attn, k, batch_size=3, compute_entropy=True)  # TRL's method (fused LM head)
    logps, ent, s2 = per_token_logps_entropies_sum_pi_squared(trainer.model, ids, attn, k, temperature=0.7,
                                                              batch_size=3)
    # fp32 in two reduction orders (TRL's forward against ours): a few ulps, more under AVX-512 kernels
    torch.testing.assert_close(logps, trl_logps, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(ent, trl_ent, atol=1e-5, rtol=1e-6)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attn).logits[:, -k - 1:-1] / 0.7
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(s2, logits.softmax(-1).pow(2).sum(-1) * mask, atol=1e-6, rtol=1e-6)
    assert (s2[~mask] == 0).all() and (logps[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert ((s2 > 0) & (s2 <= 1) | ~mask).all()


@pytest.mark.parametrize("peft", [False, True])
def test_otb_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "otb", peft, loss_type="dapo", token_weighting="otb")
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    ctx, out = seen["ctx"], seen["out"]
    assert ctx.sum_pi_squared is not None and ctx.sum_pi_squared.shape == ctx.completion_mask.shape
    m = ctx.completion_mask.bool()
    # Σπ² bounds of a softmax: π_y² ≤ Σπ² ≤ 1 on real tokens; 0 on padding
    assert (ctx.sum_pi_squared[m] >= ctx.logps[m].exp() ** 2 - 1e-6).all() and (ctx.sum_pi_squared[m] <= 1).all()
    assert (ctx.sum_pi_squared[~m] == 0).all()
    expected = otb_loop(ctx.rewards, ctx.logps, ctx.sum_pi_squared, ctx.completion_mask, ctx.group_size)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # per-token baselines: within one row the advantage changes along the completion (GRPO's is constant)
    assert any(len(set(row[mm].tolist())) > 1 for row, mm in zip(out, m) if mm.sum() > 1)
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_otb_composes_with_filter_and_grpo_loss(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="grpo"))
    trainer = ours(tmp_path / "otb", loss_type="grpo", token_weighting="otb", rollout_filter="zero_variance_filter")
    seen = record_token_stage(trainer)
    loss, grads, inputs = one_step(trainer)
    ctx, out = seen["ctx"], seen["out"]
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    dropped = torch.isnan(ctx.rewards)
    assert dropped.any() and (~dropped).any()  # this batch has one all-equal group (dropped) and one kept
    assert (out[dropped] == 0).all()
    expected = otb_loop(ctx.rewards, ctx.logps, ctx.sum_pi_squared, ctx.completion_mask, ctx.group_size)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert grads_differ(base_grads, grads)
