"""LightningRL's accuracy anchor (`loss_type="lightningrl"`) on the tiny model: on-policy the loss is GRPO's plus
`w` times the mean NLL over the correct rollouts' tokens (recomputed here from the rollouts' own rewards), the
gradient changes, full and LoRA; the weights do not depend on the micro-batch split; composition with an advantage
variant; a batch with no correct rollout trains as the clipped surrogate alone."""

import pytest
import torch

from tests.conftest import grads_differ, one_step, parity_reward
from tests.integration.objective_helpers import current_logps, loss_and_grads, ours, split_and_merged

PEFT = [False, True]
ANCHOR = dict(loss_type="lightningrl", beta=0.0, epsilon_high=0.2)


def _correct_rows(trainer, inputs) -> torch.Tensor:
    """The rollouts parity_reward scores 1, from the completions' text (TRL's decoding, chat format)."""
    texts = trainer.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
    rewards = parity_reward([[{"role": "assistant", "content": t}] for t in texts])
    return torch.tensor(rewards) >= 1.0


@pytest.mark.parametrize("peft", PEFT)
def test_anchor_adds_w_times_the_mean_nll_of_correct_tokens(tmp_path, peft):
    coef = 0.5
    loss_grpo, g_grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "anchor", peft, **ANCHOR, lightningrl_nll_coef=coef)
    loss, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])  # same rollouts
    correct = _correct_rows(trainer, inputs)
    assert 0 < correct.sum() < correct.numel()  # the toy batch has both
    assert torch.equal(inputs["groupx_anchor_weights"] > 0, correct)
    mask = inputs["completion_mask"]
    nll = -current_logps(trainer, inputs) * mask
    expected = coef * nll[correct].sum() / mask[correct].sum()  # official token reduction
    torch.testing.assert_close(loss - loss_grpo, expected, atol=1e-5, rtol=1e-4)
    assert grads_differ(g_grpo, grads)


def test_sequence_reduction(tmp_path):
    trainer = ours(tmp_path / "seq", **ANCHOR, lightningrl_nll_coef=0.5, lightningrl_nll_reduction="sequence")
    loss, _, inputs = one_step(trainer)
    loss_grpo, _, _ = one_step(ours(tmp_path / "grpo", loss_type="grpo"))
    correct, mask = _correct_rows(trainer, inputs), inputs["completion_mask"]
    nll = -current_logps(trainer, inputs) * mask
    expected = 0.5 * (nll[correct].sum(-1) / mask[correct].sum(-1)).mean()
    torch.testing.assert_close(loss - loss_grpo, expected, atol=1e-5, rtol=1e-4)


def test_no_correct_rollout_is_the_clipped_surrogate(tmp_path):
    # threshold above every reward: no anchor, the gradient is GRPO's
    _, g_grpo, _ = one_step(ours(tmp_path / "grpo", loss_type="grpo"))
    trainer = ours(tmp_path / "none", **ANCHOR, lightningrl_nll_threshold=2.0)
    _, grads, inputs = one_step(trainer)
    assert inputs["groupx_anchor_weights"].eq(0).all()
    for k in g_grpo:
        torch.testing.assert_close(grads[k], g_grpo[k], atol=1e-6, rtol=1e-5)


def test_micro_batch_split_does_not_change_the_loss(tmp_path):
    trainer = ours(tmp_path, **ANCHOR, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    (loss_a, grads_a), (loss_b, grads_b) = split_and_merged(trainer)
    torch.testing.assert_close(loss_a, loss_b, atol=1e-6, rtol=1e-5)
    for k in grads_a:
        torch.testing.assert_close(grads_a[k], grads_b[k], atol=1e-6, rtol=1e-5)


def test_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", **ANCHOR))
    trainer = ours(tmp_path / "b", **ANCHOR, advantage_estimator="sign_adv")
    _, grads, inputs = one_step(trainer)
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0} and (inputs["groupx_anchor_weights"] > 0).any()
    assert grads_differ(base, grads)
    loss, _ = loss_and_grads(trainer, inputs)
    assert torch.isfinite(loss)


def test_registry_defaults_train_with_the_reference_kl(tmp_path):
    import trl_groupx

    trainer = ours(tmp_path, True, **trl_groupx.get_variant("lightningrl").flags)  # beta 0.01: LoRA base as reference
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert "kl" in trainer.state.log_history[0]
