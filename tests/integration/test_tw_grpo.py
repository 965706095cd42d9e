"""TW-GRPO (token_weighting="tw_grpo") on the tiny model.

- The trainer fills `ctx.intra_group_token_divergence` with `D_t` recomputed here from an independent forward of
  the whole batch (full log-softmax of the temperature-scaled logits) and plain loops over groups, members,
  positions and the vocabulary; the stage's output equals the advantages times the official weights (loops, each
  group at its own length); the trained rows are those rows (TRL shuffles); the gradient differs from plain GRPO.
- Full and LoRA; composition with a sampling filter (dropped rollouts) and loss_type="grpo".
- The position chunking of the group forward does not change the numbers.
"""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage
from tests.unit.token_weights.test_tw_grpo import official_loops
from trl_groupx.token_weights.tw_grpo import intra_group_token_divergence

TEMPERATURE = 0.7


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, temperature=TEMPERATURE,
                         **flags)


def record_rollout_batch(trainer):
    """The generation batch (global order, groups contiguous) as the token stage sees it."""
    seen = {}
    original = trainer._token_context

    def spy(output, rewards, group_size):
        seen.update({k: output[k].clone() for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")})
        return original(output, rewards, group_size)

    trainer._token_context = spy
    return seen


def divergence_loops(logps, mask, group_size):
    """`D_t` by hand from `(N, T, V)` log-probs: per group, position, member and vocabulary entry; 0 past the
    group's longest completion."""
    n, t_len, vocab = logps.shape
    out = torch.zeros(n, t_len, dtype=torch.float64)
    lp = logps.double()
    for g in range(0, n, group_size):
        rows = range(g, g + group_size)
        length = max((int(mask[i].nonzero().max()) + 1 if mask[i].any() else 0) for i in rows)
        for t in range(length):
            filled = [lp[i, t] if mask[i, t] else torch.full((vocab,), -math.log(vocab), dtype=torch.float64)
                      for i in rows]
            mean = sum(filled) / group_size
            total = 0.0
            for row in filled:
                for v in range(vocab):
                    d = min(max(float(mean[v] - row[v]), -11.0), 11.0)
                    total += math.exp(d) - d - 1.0
            for i in rows:
                out[i, t] = total / group_size
    return out


def independent_logps(trainer, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    k = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attn).logits[:, -k - 1:-1]
    return torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)


def expected_token_advantages(advantages, logps, mask, group_size, alpha=1.7):
    """Advantages times the official weights, each group at its own length (its longest completion)."""
    n, t_len = mask.shape
    out = torch.zeros(n, t_len, dtype=torch.float64)
    for g in range(0, n, group_size):
        rows = slice(g, g + group_size)
        real = mask[rows].bool().any(0)
        length = int(real.nonzero().max()) + 1 if real.any() else 0
        if length:
            w = official_loops(logps[rows, :length].double(), mask[rows, :length], group_size, alpha)
            out[rows, :length] = w * torch.nan_to_num(advantages[rows].double())[:, None]
    return out.float()


@pytest.mark.parametrize("peft", [False, True])
def test_tw_grpo_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "tw", peft, loss_type="dapo", token_weighting="tw_grpo")
    seen, batch = record_token_stage(trainer), record_rollout_batch(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    ctx, out = seen["ctx"], seen["out"]
    mask = ctx.completion_mask
    assert (mask == 0).any()  # the batch has completion padding
    logps = independent_logps(trainer, batch)
    expected_d = divergence_loops(logps, mask, ctx.group_size)
    assert (expected_d > 0).any()
    torch.testing.assert_close(ctx.intra_group_token_divergence.double(), expected_d, atol=1e-4, rtol=1e-4)
    expected = expected_token_advantages(seen["advantages"], logps, mask, ctx.group_size)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    m = mask.bool()
    weights = out[m] / seen["advantages"][:, None].expand_as(out)[m]
    finite = torch.isfinite(weights)
    assert (weights[finite] >= 1 - 1e-5).all() and (weights[finite] <= 1.7 + 1e-5).all()
    assert any(len(set(row[mm].tolist())) > 1 for row, mm in zip(out, m) if mm.sum() > 1)  # not constant per row
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_tw_grpo_composes_with_filter_and_grpo_loss(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="grpo", rollout_filter="zero_variance_filter"))
    trainer = ours(tmp_path / "tw", loss_type="grpo", token_weighting="tw_grpo",
                   rollout_filter="zero_variance_filter")
    seen, batch = record_token_stage(trainer), record_rollout_batch(trainer)
    loss, grads, inputs = one_step(trainer)
    ctx, out = seen["ctx"], seen["out"]
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    dropped = torch.isnan(ctx.rewards)
    assert dropped.any() and (~dropped).any()  # one all-equal group dropped, one kept
    assert (out[dropped] == 0).all()
    logps = independent_logps(trainer, batch)
    # the dropped rows' completion mask is 0: they enter as uniform distributions, and their group reads nothing
    expected = expected_token_advantages(seen["advantages"], logps, ctx.completion_mask, ctx.group_size)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert grads_differ(base_grads, grads)


def test_position_chunks_do_not_change_the_divergence(tmp_path):
    trainer = ours(tmp_path, token_weighting="tw_grpo")
    batch = record_rollout_batch(trainer)
    one_step(trainer)
    args = (trainer.model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
            batch["completion_mask"], trainer.num_generations)
    whole = intra_group_token_divergence(*args, temperature=TEMPERATURE)
    chunked = intra_group_token_divergence(*args, temperature=TEMPERATURE, position_chunk=2)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
    g = trainer.num_generations
    assert (whole[:g] != 0).any()
    # this batch's second group sampled four identical completions: identical distributions, D = 0 everywhere
    assert (batch["completion_ids"][g:] == batch["completion_ids"][g]).all() and (whole[g:] == 0).all()
    only_second = intra_group_token_divergence(*args, temperature=TEMPERATURE, groups=[1])
    assert (only_second == 0).all()  # the first group is left to another process
