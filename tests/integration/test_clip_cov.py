"""Clip-Cov on the tiny model: one real step full and LoRA, off-policy, split invariance, composition."""

import dataclasses
import functools

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_split_invariant, loss_and_grads, off_policy_batch, ours

PEFT = [False, True]
NO_WINDOW = dict(clip_cov_lb=1e8, clip_cov_ub=1e9)  # no token's covariance falls there: nothing is cut


@pytest.mark.parametrize("peft", PEFT)
def test_clip_cov_is_ppo_without_cuts_and_differs_with_them(tmp_path, peft):
    # empty covariance window → exactly the clipped surrogate with the same bounds and token mean (dapo), off-policy
    ppo = ours(tmp_path / "a", peft, loss_type="dapo", epsilon=1.0, epsilon_high=1.0)
    loss_ppo, g_ppo = loss_and_grads(ppo, off_policy_batch(ppo))
    same = ours(tmp_path / "b", peft, loss_type="clip_cov", epsilon=1.0, epsilon_high=1.0, **NO_WINDOW)
    loss_same, g_same = loss_and_grads(same, off_policy_batch(same))
    torch.testing.assert_close(loss_same, loss_ppo, atol=1e-6, rtol=1e-5)
    for k in g_ppo:
        torch.testing.assert_close(g_same[k], g_ppo[k], atol=1e-6, rtol=1e-5)
    # a wide window and a large ratio cut half the tokens: the gradient changes
    cut = ours(tmp_path / "c", peft, loss_type="clip_cov", epsilon=1.0, epsilon_high=1.0, clip_cov_ratio=0.5,
               clip_cov_lb=-1e9, clip_cov_ub=1e9)
    torch.manual_seed(0)
    _, g_cut = loss_and_grads(cut, off_policy_batch(cut))
    assert grads_differ(g_ppo, g_cut, atol=1e-7)


def test_clip_cov_cuts_the_counted_tokens(tmp_path):
    # from the trainer's own micro-batch: with ratio .5 and a wide window, ⌊.5·#tokens⌋ real tokens lose their loss
    # (sign advantages ±1, so no token has A = 0 and every cut is visible; bounds [0, 2] clip nothing here)
    trainer = ours(tmp_path, loss_type="clip_cov", clip_cov_ratio=0.5, clip_cov_lb=-1e9, clip_cov_ub=1e9,
                   advantage_estimator="sign_adv")
    inputs = off_policy_batch(trainer)
    fn, seen = trainer.variants["objective"].fn, {}

    @functools.wraps(fn)
    def spy(ctx, **kw):
        out = fn(ctx, **kw)
        real = (ctx.mask > 0) & (ctx.advantages != 0)
        zero_adv = (ctx.mask > 0) & (ctx.advantages == 0)
        seen.update(cut=((out == 0) & real).sum().item(), zero_adv=zero_adv.sum().item(),
                    n=int(0.5 * ctx.mask.sum().item()))
        return out

    trainer.variants["objective"] = dataclasses.replace(trainer.variants["objective"], fn=spy)
    loss_and_grads(trainer, inputs)
    assert seen["zero_adv"] == 0 and seen["cut"] == seen["n"] > 0


def test_clip_cov_loss_scale_independent_of_accumulation_split(tmp_path):
    # the aggregation (global token mean) is split-invariant; the per-micro-batch selection is switched off here
    trainer = ours(tmp_path, loss_type="clip_cov", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                   **NO_WINDOW)
    assert_split_invariant(trainer)


def test_clip_cov_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="clip_cov"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="clip_cov", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
