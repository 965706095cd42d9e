"""DHPO on the tiny model: w=1 is TRL's GRPO loss and w=0 TRL's sequence-level (GSPO) loss on an off-policy
batch, bit-exact in loss and gradient; the averaged mix differs from both; full and LoRA; split invariance;
composition with an advantage variant."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_split_invariant, loss_and_grads, off_policy_batch, ours

PEFT = [False, True]


def _close(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0.0, rtol=0.0)


@pytest.mark.parametrize("peft", PEFT)
def test_dhpo_endpoints_and_mix_off_policy(tmp_path, peft):
    grpo = ours(tmp_path / "a", peft, loss_type="grpo")
    l_grpo, g_grpo = loss_and_grads(grpo, off_policy_batch(grpo))
    gspo = ours(
        tmp_path / "b", peft, loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4
    )
    l_gspo, g_gspo = loss_and_grads(gspo, off_policy_batch(gspo))
    one = ours(tmp_path / "c", peft, loss_type="dhpo", dhpo_mix_weight=1.0)
    l_one, g_one = loss_and_grads(one, off_policy_batch(one))
    zero = ours(tmp_path / "d", peft, loss_type="dhpo", dhpo_mix_weight=0.0)
    l_zero, g_zero = loss_and_grads(zero, off_policy_batch(zero))
    torch.testing.assert_close(l_one, l_grpo, atol=0.0, rtol=0.0)
    torch.testing.assert_close(l_zero, l_gspo, atol=0.0, rtol=0.0)
    _close(g_one, g_grpo)
    _close(g_zero, g_gspo)
    mix = ours(tmp_path / "e", peft, loss_type="dhpo")
    _, g_mix = loss_and_grads(mix, off_policy_batch(mix))
    assert grads_differ(g_mix, g_grpo, atol=1e-7) and grads_differ(g_mix, g_gspo, atol=1e-7)


@pytest.mark.parametrize("peft", PEFT)
def test_dhpo_on_policy_step_is_grpo(tmp_path, peft):
    _, g_grpo, _ = one_step(ours(tmp_path / "a", peft, loss_type="grpo"))
    _, g_dhpo, _ = one_step(ours(tmp_path / "b", peft, loss_type="dhpo"))
    for k in g_grpo:
        torch.testing.assert_close(g_grpo[k], g_dhpo[k], atol=1e-6, rtol=1e-5)


def test_dhpo_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="dhpo", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_dhpo_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="dhpo"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="dhpo", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
