"""GPG on the tiny model: one real step, full and LoRA; REINFORCE gradient off-policy; split invariance."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_split_invariant, loss_and_grads, off_policy_batch, ours

PEFT = [False, True]


@pytest.mark.parametrize("peft", PEFT)
def test_gpg_step_changes_gradient_and_uses_r_minus_mean(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "gpg", peft, loss_type="gpg", scale_rewards="none", beta=0.0)
    assert trainer.ref_model is None  # no reference model is loaded (beta = 0, and LoRA disables the adapter)
    loss, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    expected = rewards - rewards.view(-1, 4).mean(1).repeat_interleave(4)  # A = r - mean_g(r), no std
    # TRL shuffles the rows after scoring: compare as multisets
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    # on-policy the loss value is -Σ A·logp / #tokens (not -A·ρ): check it from the inputs
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)


@pytest.mark.parametrize("peft", PEFT)
def test_gpg_off_policy_ignores_rollout_logps(tmp_path, peft):
    # num_iterations=2-style step (ratios ≠ 1): GPG's gradient is the score function at the current policy, the
    # same as if the batch had been sampled from it; GRPO's (ratio-weighted, clipped) differs.
    trainer = ours(tmp_path / "a", peft, loss_type="gpg", scale_rewards="none")
    inputs = off_policy_batch(trainer)
    _, off = loss_and_grads(trainer, inputs)
    on_inputs = {k: v for k, v in inputs.items() if k != "old_per_token_logps"}
    _, on = loss_and_grads(trainer, on_inputs)
    for k in off:
        torch.testing.assert_close(off[k], on[k])
    grpo = ours(tmp_path / "b", peft, loss_type="grpo", scale_rewards="none")
    _, g = loss_and_grads(grpo, off_policy_batch(grpo))
    assert grads_differ(g, off, atol=1e-6)


def test_gpg_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="gpg", scale_rewards="none", per_device_train_batch_size=4,
                   gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_gpg_composes_with_an_advantage_variant(tmp_path):
    # GPG's surrogate on sign advantages (2r - 1): the trained advantages are the advantage stage's
    trainer = ours(tmp_path, loss_type="gpg", advantage_estimator="sign_adv")
    loss, grads, inputs = one_step(trainer)
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
