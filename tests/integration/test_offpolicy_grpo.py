"""Off-policy GRPO on the tiny model (full and LoRA): with `offpolicy_grpo_lag=2` one generation batch serves two
optimizer steps; the second step's ratios are taken against the stored log-probs of the generating weights (≠ 1),
which changes the gradient against on-policy GRPO on the same rollouts; number for number it is TRL's own
`loss_type="grpo"` with the same sync period. Also: exact loss from the trainer's inputs, split invariance,
composition with an advantage variant."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import (
    _perturb,
    assert_split_invariant,
    current_logps,
    loss_and_grads,
    ours,
)

LAG2 = {"offpolicy_grpo_lag": 2, "steps_per_generation": 2}  # 16 rollouts per generation, 8 per optimizer step


def second_step(trainer):
    """Step 1 on the first half of a generation batch, a weight update, then the buffered second half (no new
    generation): returns (step-1 inputs, step-2 inputs)."""
    _, _, first = one_step(trainer)
    _perturb(trainer)  # stands in for the optimizer step between the two (the same move for every trainer)
    trainer._step = 1
    second = trainer._prepare_inputs(None)  # 1 % (spg · num_iterations) != 0 → served from the buffer
    return first, second


@pytest.mark.parametrize("peft", [False, True])
def test_stale_rollouts_use_the_stored_behaviour_logps(tmp_path, peft):
    ours_trainer = ours(tmp_path / "a", peft, loss_type="offpolicy_grpo", **LAG2)
    trl_trainer = ours(tmp_path / "b", peft, loss_type="grpo", steps_per_generation=2)  # TRL's own loss path
    _first, second = second_step(ours_trainer)
    _first_trl, second_trl = second_step(trl_trainer)
    assert torch.equal(second["completion_ids"], second_trl["completion_ids"])
    # the behaviour log-probs were stored at generation time, before the update: the ratio now differs from 1
    assert "old_per_token_logps" in second
    mask = second["completion_mask"].bool()
    assert (current_logps(ours_trainer, second) - second["old_per_token_logps"])[mask].abs().max() > 1e-3
    # number for number TRL's GRPO with the same sync period
    loss, grads = loss_and_grads(ours_trainer, second)
    loss_trl, grads_trl = loss_and_grads(trl_trainer, second_trl)
    torch.testing.assert_close(loss, loss_trl, atol=1e-6, rtol=1e-5)
    for k in grads:
        torch.testing.assert_close(grads[k], grads_trl[k], atol=1e-6, rtol=1e-4)
    # the same rollouts treated as on-policy (ρ = 1, what lag 1 would do): a different gradient
    on_policy = {k: v for k, v in second.items() if k != "old_per_token_logps"}
    _, grads_on = loss_and_grads(ours_trainer, on_policy)
    assert grads_differ(grads, grads_on)


def test_loss_from_the_trainers_inputs(tmp_path):
    # loss = mean_i (1/|o_i|) Σ_t −min(ρ A, clip(ρ, .8, 1.2) A), ρ = exp(logp − stored logp of the generating weights)
    trainer = ours(tmp_path, loss_type="offpolicy_grpo", **LAG2)
    _, second = second_step(trainer)
    loss, _ = loss_and_grads(trainer, second)
    logps = current_logps(trainer, second)
    adv, mask = second["advantages"].unsqueeze(1), second["completion_mask"].float()
    ratio = torch.exp(logps - second["old_per_token_logps"])
    per_token = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    expected = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_lag_one_is_on_policy(tmp_path):
    # lag 1 = steps_per_generation = gradient_accumulation_steps: TRL stores no behaviour log-probs, ρ = 1
    _, grads, inputs = one_step(ours(tmp_path / "a", loss_type="offpolicy_grpo", offpolicy_grpo_lag=1))
    assert "old_per_token_logps" not in inputs
    _, grads_trl, _ = one_step(ours(tmp_path / "b", loss_type="grpo"))
    for k in grads:
        torch.testing.assert_close(grads[k], grads_trl[k], atol=1e-6, rtol=1e-4)


def test_loss_scale_independent_of_accumulation_split(tmp_path):
    trainer = ours(tmp_path, loss_type="offpolicy_grpo", offpolicy_grpo_lag=1, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2, steps_per_generation=2)
    assert_split_invariant(trainer)


def test_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="offpolicy_grpo", **LAG2))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="offpolicy_grpo", advantage_estimator="sign_adv", **LAG2))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(base, grads)
