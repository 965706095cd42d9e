"""RGRA on the tiny model: GRPO's gradient on-policy, REINFORCE's off-policy; full and LoRA; split invariance."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_split_invariant, loss_and_grads, off_policy_batch, ours

PEFT = [False, True]


@pytest.mark.parametrize("peft", PEFT)
def test_rgra_matches_grpo_on_policy_and_differs_off_policy(tmp_path, peft):
    # catalog check: on-policy the gradient equals GRPO's at ratio 1 (same advantages, sequence mean, KL to the
    # reference, which is 0 with zero gradient at the first step)
    _, g_grpo, in_grpo = one_step(ours(tmp_path / "a", peft, loss_type="grpo", beta=0.04))
    trainer = ours(tmp_path / "b", peft, loss_type="rgra", beta=0.04, use_bias_correction_kl=False)
    _, g_rgra, in_rgra = one_step(trainer)
    assert torch.equal(in_grpo["advantages"], in_rgra["advantages"])
    for k in g_grpo:
        torch.testing.assert_close(g_grpo[k], g_rgra[k], atol=1e-6, rtol=1e-5)
    # off-policy (num_iterations=2-style): GRPO weights by clipped ratios, RGRA does not
    grpo = ours(tmp_path / "c", peft, loss_type="grpo", beta=0.04)
    rgra = ours(tmp_path / "d", peft, loss_type="rgra", beta=0.04, use_bias_correction_kl=False)
    _, o_grpo = loss_and_grads(grpo, off_policy_batch(grpo))
    _, o_rgra = loss_and_grads(rgra, off_policy_batch(rgra))
    assert grads_differ(o_grpo, o_rgra, atol=1e-6)
    assert rgra._metrics["train"]["kl"][-1] > 0  # the moved policy pays the k3 KL


def test_rgra_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="rgra", beta=0.04, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_rgra_composes_with_a_token_weight_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="rgra"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="rgra", token_weighting="gtpo_entropy"))
    assert inputs["advantages"].shape == inputs["completion_ids"].shape
    assert grads_differ(base, grads)
