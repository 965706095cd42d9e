"""HAPO Asymmetric Adaptive Clipping on the tiny model: DAPO on-policy, a different gradient off-policy (full and
LoRA), exact loss from the trainer's own inputs (current-policy entropies), composition with HAPO's token stage."""

import pytest
import torch

from tests.conftest import grads_differ
from tests.integration.objective_helpers import (
    assert_on_policy_matches,
    assert_split_invariant,
    current_logps,
    loss_and_grads,
    off_policy_batch,
    off_policy_loss_and_grads,
    ours,
)
from trl_groupx.token_weights.hapo import entropy_h_hat


def mild_off_policy_batch(trainer):
    """`off_policy_batch` with rollout log-probs set so that every ratio sits in the band where fixed and adaptive
    bounds disagree: ρ = 1.3 for A > 0 and 0.7 for A < 0 (1 for A = 0). Fixed bounds [0.8, 1.2] clip them all; the
    adaptive ones leave unclipped the tokens whose |ĥ| > 0.5 on the widened side (the shared perturbation alone puts
    most ratios far outside [0.6, 1.4], where both clip and the gradients coincide)."""
    inputs = off_policy_batch(trainer)
    logps = current_logps(trainer, inputs)
    adv = inputs["advantages"]
    adv = adv.unsqueeze(1).expand_as(logps) if adv.dim() == 1 else adv
    target = torch.where(adv > 0, torch.full_like(logps, 1.3), torch.where(adv < 0, torch.full_like(logps, 0.7), 1.0))
    return {**inputs, "old_per_token_logps": logps - target.log()}


@pytest.mark.parametrize("peft", [False, True])
def test_hapo_clip_on_and_off_policy(tmp_path, peft):
    # on-policy ρ = 1: nothing clipped, no cap → DAPO's gradient
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "dapo", "epsilon_high": 0.2},
                             {"loss_type": "hapo_clip", "epsilon_high": 0.2})
    # off-policy: entropy-adaptive bounds vs verl's fixed bounds with the same cap
    _, g_fixed = off_policy_loss_and_grads(tmp_path / "c", peft, mild_off_policy_batch, loss_type="dual_clip",
                                           dual_clip_c=10.0, epsilon_high=0.2)
    _, g_off = off_policy_loss_and_grads(tmp_path / "d", peft, mild_off_policy_batch, loss_type="hapo_clip",
                                         epsilon_high=0.2)
    assert grads_differ(g_fixed, g_off, atol=1e-7)
    assert all(torch.isfinite(g).all() for g in g_off.values())


def _logps_and_entropies(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, inputs["completion_ids"].size(1), compute_entropy=True
        )
    return logps, entropies


@pytest.mark.parametrize("official_sign", [False, True])
def test_hapo_clip_loss_from_the_trainers_inputs(tmp_path, official_sign):
    trainer = ours(tmp_path, loss_type="hapo_clip", epsilon_high=0.2, hapo_clip_official_sign=official_sign)
    inputs = mild_off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    logps, entropies = _logps_and_entropies(trainer, inputs)
    mask = inputs["completion_mask"].float()
    adv = inputs["advantages"].unsqueeze(1)
    h = entropy_h_hat(entropies, mask.bool(), 0.8)
    h = h.abs() if official_sign else h
    low = torch.where(h <= 0, 0.2 * (1 - h), torch.full_like(h, 0.2))
    high = torch.where(h > 0, 0.2 * (1 + h), torch.full_like(h, 0.2))
    ratio = (logps - inputs["old_per_token_logps"]).exp()
    ppo = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
    per_token = torch.where(adv < 0, torch.minimum(ppo, -adv * 10.0), ppo)
    fixed = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    # some token's gradient differs from the fixed bounds' (unclipped here, clipped there, or the reverse)
    moved = ((per_token - fixed).abs() > 1e-6) & (adv != 0) & (mask > 0)
    assert (moved & ((ratio - 1).abs() < 0.4)).any()
    torch.testing.assert_close(loss, (per_token * mask).sum() / mask.sum(), atol=1e-6, rtol=1e-5)


def test_hapo_clip_split_scale_without_entropy_statistics(tmp_path):
    # the entropy statistics are per micro-batch (as in the official code), so with α > 0 the bounds depend on the
    # split; with α = 0 only the aggregation remains, whose scale must not depend on the split
    trainer = ours(tmp_path, loss_type="hapo_clip", hapo_clip_alpha=0.0, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_hapo_clip_composes_with_hapo_token_weights(tmp_path):
    # the full HAPO objective side: token stage (TLGA + DAR, per-token advantages) + adaptive clipping
    dapo = ours(tmp_path / "a", loss_type="dapo", epsilon_high=0.2, token_weighting="hapo")
    inputs = mild_off_policy_batch(dapo)
    assert inputs["advantages"].dim() == 2
    _, g_dapo = loss_and_grads(dapo, inputs)
    full = ours(tmp_path / "b", loss_type="hapo_clip", epsilon_high=0.2, token_weighting="hapo")
    inputs_full = mild_off_policy_batch(full)
    torch.testing.assert_close(inputs_full["advantages"], inputs["advantages"])
    _, g_full = loss_and_grads(full, inputs_full)
    assert grads_differ(g_dapo, g_full, atol=1e-7)
    assert all(torch.isfinite(g).all() for g in g_full.values())
