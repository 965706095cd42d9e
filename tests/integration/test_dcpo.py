"""DCPO (token_weighting="dcpo") on the tiny model.

- The tempered forward (`token_weights/tempered_logps.py`) gives TRL's own log-probs and entropies at TRL's
  temperature (fused LM head) to 1e-6 on a real generated batch, and at each listed temperature the log-softmax of
  the model's raw logits divided by it; padding is 0.
- One real step, full and LoRA: the trainer fills `ctx.tempered_logps` at `[T_high, T_low]`, the stage's output is
  DCPO recomputed from the recorded context (first batch: H = 0 → T_high, α = (0.1/q)/(0.1/q + 1)), the state
  holds the batch's mean NLL for the next one, and the gradient differs from plain GRPO on the same batch.
- Composition with the objective stage: dual-clip PPO (the official loss), against dual-clip alone.
- A resumed run continues exactly: the entropy state is saved with each checkpoint.
"""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from tests.integration.test_hapo import record_token_stage
from trl_groupx.token_weights.dcpo import dcpo_token_advantages
from trl_groupx.token_weights.tempered_logps import per_token_logps_at_temperatures
from trl_groupx.trainer import VARIANT_STATE_NAME

DCPO_DEFAULTS = dict(dcpo_entropy_target=0.5, dcpo_temperatures=[1.2, 0.8], dcpo_entropy_gap_cap=0.1,
                     dcpo_success_threshold=0.05)


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def test_tempered_forward_matches_trl(tmp_path):
    trainer = ours(tmp_path, token_weighting="dcpo", temperature=0.7)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    inputs = trainer._prepare_inputs(batch)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    k = inputs["completion_ids"].size(1)
    assert (inputs["completion_mask"] == 0).any()  # the batch has completion padding
    with torch.no_grad():
        trl_logps, trl_ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attn, k, batch_size=3, compute_entropy=True)  # TRL's method (fused LM head)
        raw = trainer.model(input_ids=ids, attention_mask=attn).logits[:, -k - 1:-1]
    logps, ent, tempered = per_token_logps_at_temperatures(trainer.model, ids, attn, k, temperature=0.7,
                                                           temperatures=[1.2, 0.8], batch_size=3)
    mask = inputs["completion_mask"].bool()
    # fp32 in two reduction orders (TRL's forward against ours): a few ulps, more under AVX-512 kernels
    torch.testing.assert_close(logps, trl_logps * mask, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(ent, trl_ent * mask, atol=1e-5, rtol=1e-6)
    for m, t in enumerate((1.2, 0.8)):
        want = (raw / t).log_softmax(-1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
        torch.testing.assert_close(tempered[..., m], want * mask, atol=1e-5, rtol=1e-6)
    assert (tempered[~mask] == 0).all() and (logps[~mask] == 0).all()


def expected_first_batch(seen) -> torch.Tensor:
    """DCPO on the recorded context with an empty state (the first batch), and α checked by hand."""
    ctx = seen["ctx"]
    rewards = ctx.rewards
    q = ((rewards > 0.05) & ~torch.isnan(rewards)).sum().item() / (~torch.isnan(rewards)).sum().item()
    assert 0 < q < 1  # the batch has successes and failures: α = (0.1/q)/(0.1/q + 1) with H = 0 ≤ H0
    alpha = (0.1 / q) / (0.1 / q + 1)
    mask = ctx.completion_mask.bool()
    rho = torch.exp(ctx.tempered_logps[..., 0] - ctx.logps)  # T_high = 1.2
    by_hand = ((1 - alpha) * seen["advantages"][:, None]
               + alpha * (rewards > 0.05).float()[:, None] * rho) * mask
    out = dcpo_token_advantages(seen["advantages"], ctx, **DCPO_DEFAULTS, state={})
    torch.testing.assert_close(out, by_hand, atol=1e-6, rtol=1e-6)
    return out


@pytest.mark.parametrize("peft", [False, True])
def test_dcpo_step_full_and_lora(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "dcpo", peft, loss_type="dapo", token_weighting="dcpo")
    seen = record_token_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    ctx, out = seen["ctx"], seen["out"]
    mask = ctx.completion_mask.bool()
    assert ctx.tempered_logps.shape == (*mask.shape, 2) and ctx.logps is not None
    assert not torch.allclose(ctx.tempered_logps[..., 0][mask], ctx.logps[mask])  # ρ ≠ 1: the target moves
    torch.testing.assert_close(out, expected_first_batch(seen))
    # the state now holds this batch's mean NLL per token (the official `actor/entropy_loss`)
    assert math.isclose(trainer.variant_state["dcpo"]["entropy"], -ctx.logps[mask].double().mean().item(),
                        rel_tol=1e-9)
    # per-token advantages: a successful completion's advantage changes along it (GRPO's is constant)
    assert any(len(set(row[mm].tolist())) > 1 for row, mm in zip(out, mask) if mm.sum() > 1)
    for ids, row in zip(inputs["completion_ids"], inputs["advantages"]):  # the trained rows (TRL shuffles)
        assert any(torch.equal(ids, c) and torch.allclose(row, o, atol=1e-6)
                   for c, o in zip(ctx.completion_ids, out))
    assert grads_differ(base_grads, grads)


def test_dcpo_composes_with_dual_clip_objective(tmp_path):
    # the official pairing: DCPO's advantages under dual-clip PPO (clip 0.2/0.2, c = 3, per-micro-batch token mean)
    flags = dict(loss_type="dual_clip", dual_clip_c=3.0, epsilon=0.2, epsilon_high=0.2, loss_aggregation="token_mean")
    _, base_grads, _ = one_step(ours(tmp_path / "base", **flags))
    trainer = ours(tmp_path / "dcpo", token_weighting="dcpo", **flags)
    seen = record_token_stage(trainer)
    loss, grads, inputs = one_step(trainer)
    assert trainer.variants["objective"].id == "dual_clip" and trainer.variants["token_weights"].id == "dcpo"
    torch.testing.assert_close(seen["out"], expected_first_batch(seen))
    assert torch.isfinite(loss) and inputs["advantages"].dim() == 2
    assert grads_differ(base_grads, grads)


def _run(path):
    return ours(path, token_weighting="dcpo", max_steps=3, save_strategy="steps", save_steps=1)


def test_dcpo_resume_continues_exactly(tmp_path):
    full = _run(tmp_path / "full")
    full.train()
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert saved["dcpo"]["entropy"] != full.variant_state["dcpo"]["entropy"]
    # above H0: step 3 uses T_low; a resume that lost the state (H = 0) would use T_high and train other weights
    assert saved["dcpo"]["entropy"] > 0.5

    resumed = _run(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.variant_state["dcpo"] == full.variant_state["dcpo"]
    assert_same_weights(full, resumed)
