"""Zero-variance group filter on the tiny model: one real step, full and LoRA; dropped groups neutralised."""

import pytest
import torch

from tests.conftest import grads_differ, one_step, parity_reward
from tests.integration.test_gfpo import _generate, _spy, _trainer

G = 4


def first_group_solved(completions, **kwargs):
    """Parity reward, except that the first group of every generation batch is all-correct (zero variance)."""
    return [1.0 if i < G else r for i, r in enumerate(parity_reward(completions))]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_zero_variance_groups_are_dropped(tmp_path, peft):
    trainer = _trainer(tmp_path, peft, rollout_filter="zero_variance_filter", reward_funcs=first_group_solved)
    seen = _spy(trainer)
    output = _generate(trainer)
    b, keep = seen["batch"], seen["keep"]
    r = trainer._rewards_per_func[:, 0].view(-1, G)
    expected_keep = (r.max(1).values > r.min(1).values).repeat_interleave(G)
    assert torch.equal(keep, expected_keep) and not keep[:G].any() and keep.any()
    mask = output["completion_mask"]
    assert (mask[~keep] == 0).all() and (output["advantages"][~keep] == 0).all()
    assert output["num_items_in_batch"] == b.completion_lengths[keep].sum()  # the batch shrinks (no refill)
    rk = trainer._rewards_per_func[:, 0][keep].view(-1, G)
    expected = (rk - rk.mean(1, keepdim=True)) / (rk.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(output["advantages"][keep], expected.flatten())


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_zero_variance_filter_changes_the_gradient(tmp_path, peft):
    # GRPO already gives the solved group advantage 0; under the token-sum (dapo) normaliser dropping its tokens
    # rescales the update of the other groups, so the gradient changes
    _, base_grads, base_inputs = one_step(_trainer(tmp_path / "a", peft, reward_funcs=first_group_solved))
    _, grads, inputs = one_step(_trainer(tmp_path / "b", peft, rollout_filter="zero_variance_filter",
                                         reward_funcs=first_group_solved))
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    assert grads_differ(base_grads, grads)


def test_zero_variance_filter_composes_with_an_advantage_variant_and_an_objective(tmp_path):
    trainer = _trainer(tmp_path / "a", rollout_filter="zero_variance_filter", advantage_estimator="sign_adv",
                       reward_funcs=first_group_solved)
    seen = _spy(trainer)
    output = _generate(trainer)
    keep, r = seen["keep"], trainer._rewards_per_func[:, 0]
    # sign_adv would give the solved group +1; the filter removes it
    assert (output["advantages"][~keep] == 0).all() and not keep[:G].any()
    torch.testing.assert_close(output["advantages"][keep], 2 * r[keep] - 1)
    _, base, _ = one_step(_trainer(tmp_path / "b", loss_type="gmpo", advantage_estimator="sign_adv",
                                   reward_funcs=first_group_solved))
    loss, grads, _ = one_step(_trainer(tmp_path / "c", rollout_filter="zero_variance_filter", loss_type="gmpo",
                                       advantage_estimator="sign_adv", reward_funcs=first_group_solved))
    assert torch.isfinite(loss) and grads_differ(base, grads)


def test_every_group_dropped_trains_nothing(tmp_path):
    trainer = _trainer(tmp_path, rollout_filter="zero_variance_filter", reward_funcs=constant_reward)
    loss, grads, inputs = one_step(trainer)
    assert (inputs["completion_mask"] == 0).all() and (inputs["advantages"] == 0).all()
    assert torch.isfinite(loss) and all((g == 0).all() for g in grads.values())
