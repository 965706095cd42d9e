"""DPPO-Binary-TV and DPPO-Binary-KL on the tiny model: GRPO's gradient on-policy, trust-region mask off-policy; full and LoRA;
split invariance; composition."""

import math

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import (
    assert_on_policy_matches,
    assert_split_invariant,
    current_logps,
    loss_and_grads,
    off_policy_batch,
    off_policy_loss_and_grads,
    ours,
)

PEFT = [False, True]
KINDS = ["tv", "kl"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("peft", PEFT)
def test_dppo_on_and_off_policy(tmp_path, peft, kind):
    # on-policy: divergence 0, weight 1 → gradient -A ∇logp with Dr. GRPO's constant normaliser = dr_grpo's at ρ = 1
    assert_on_policy_matches(tmp_path, peft, {"loss_type": "dr_grpo"}, {"loss_type": f"dppo_{kind}"})
    # off-policy: a huge radius keeps every token (gradient -A ρ ∇logp = PPO's unclipped); a tiny one masks some
    flags = {"loss_type": f"dppo_{kind}"}
    _, g_wide = off_policy_loss_and_grads(tmp_path / "c", peft, **flags, **{f"dppo_{kind}_delta": 1e6})
    _, g_tight = off_policy_loss_and_grads(tmp_path / "d", peft, **flags, **{f"dppo_{kind}_delta": 1e-4})
    assert grads_differ(g_wide, g_tight, atol=1e-7)


@pytest.mark.parametrize("kind", KINDS)
def test_dppo_loss_from_trainer_inputs(tmp_path, kind):
    # loss = Σ -A·ρ·logp·valid·m / (B · max_completion_length), valid from |p - p_old| (TV) or the binary KL ≤ δ
    # in the direction A pushes
    delta = 1e-3
    trainer = ours(tmp_path, loss_type=f"dppo_{kind}", **{f"dppo_{kind}_delta": delta})
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    lp = current_logps(trainer, inputs)
    old, mask, adv = inputs["old_per_token_logps"], inputs["completion_mask"], inputs["advantages"].unsqueeze(1)
    p, q = lp.exp(), old.exp()
    if kind == "tv":
        valid = torch.where(adv > 0, p - q <= delta, p - q >= -delta)
    else:
        kl = q * (old - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        valid = torch.where(adv > 0, (kl <= delta) | (p <= q), (kl <= delta) | (p >= q))
    assert (~valid & (mask > 0) & (adv != 0)).any()  # the radius binds on this batch
    expected = (-adv * (lp - old).exp() * lp * valid * mask).sum() / (mask.size(0) * trainer.max_completion_length)
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("kind", KINDS)
def test_dppo_loss_scale_independent_of_accumulation_split(tmp_path, kind):
    trainer = ours(tmp_path, loss_type=f"dppo_{kind}", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


@pytest.mark.parametrize("kind", KINDS)
def test_dppo_composes_with_an_advantage_variant(tmp_path, kind):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type=f"dppo_{kind}"))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type=f"dppo_{kind}", advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
