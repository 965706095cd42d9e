"""MO-GRPO: per-function within-group z-scores, summed (no batch renormalisation); derivations in comments."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages import decoupled_normalized_advantages, group_normalized_advantages
from trl_groupx.advantages.mo_grpo import mo_grpo_advantages as mo

NAN = float("nan")
EPS = 1e-4


def test_hand_values_two_rewards():
    # G=2, one group. r1 = [0, 1]: mean .5, unbiased std sqrt(.5) → z1 = ∓.5/(sqrt(.5)+1e-4)
    # r2 = [10, 30]: mean 20, std sqrt(200) → z2 = ∓10/(sqrt(200)+1e-4) ≈ ∓sqrt(.5)
    r = torch.tensor([[0.0, 10.0], [1.0, 30.0]])
    z1 = 0.5 / (math.sqrt(0.5) + EPS)
    z2 = 10 / (math.sqrt(200) + EPS)
    torch.testing.assert_close(mo(r, 2), torch.tensor([-z1 - z2, z1 + z2]))


def test_hand_values_conflicting_rewards_cancel_per_group():
    # G=4 group, r1 = [1,1,0,0] (mean .5, std sqrt(1/3)), r2 = [0,1,0,1] (same stats):
    # z = ±.5/(sqrt(1/3)+1e-4) = ±m each → A = [m−m, m+m, −m−m, −m+m] = [0, 2m, −2m, 0]
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 1.0]])
    m = 0.5 / (math.sqrt(1 / 3) + EPS)
    torch.testing.assert_close(mo(r, 4), torch.tensor([0.0, 2 * m, -2 * m, 0.0]))


def test_catalog_check_rescaling_one_reward_leaves_advantages_unchanged():
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(12, 2, generator=gen)
    scaled = r.clone()
    scaled[:, 1] *= 100
    torch.testing.assert_close(mo(scaled, 4), mo(r, 4), atol=1e-3, rtol=0)  # up to ε
    # ... while plain summed-reward GRPO is dominated by the scaled reward
    grpo_scaled = group_normalized_advantages(scaled.sum(1), 4)
    assert not torch.allclose(grpo_scaled, group_normalized_advantages(r.sum(1), 4), atol=1e-2)


def test_single_reward_is_trl_grpo_and_gdpo_adds_a_batch_normalisation():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.2, 0.4, 0.9, 0.9])
    torch.testing.assert_close(mo(r.unsqueeze(1), 4), group_normalized_advantages(r, 4))
    torch.testing.assert_close(mo(r, 4), group_normalized_advantages(r, 4))  # (N,) read as K=1
    # GDPO (TRL normalize_then_sum) = MO-GRPO's sum, standardised over the batch (unbiased std + 1e-4)
    r2 = torch.stack([r, r.flip(0)], 1)
    s = mo(r2, 4)
    torch.testing.assert_close(decoupled_normalized_advantages(r2, 4), (s - s.mean()) / (s.std() + EPS))


def test_all_equal_group_and_constant_function_contribute_zero():
    # group 1: both functions constant → 0. group 2: r2 constant → only r1 counts: ±.5/(sqrt(.5)+1e-4)
    r = torch.tensor([[1.0, 3.0], [1.0, 3.0], [0.0, 5.0], [1.0, 5.0]])
    m = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(mo(r, 2), torch.tensor([0.0, 0.0, -m, m]))


def test_group_size_one_is_zero():
    torch.testing.assert_close(mo(torch.tensor([[0.3, 1.0], [0.9, 0.0]]), 1), torch.zeros(2))


def test_nan_entries_are_excluded_and_unscored_rows_get_zero():
    # group of 3: r1 = [1, NaN, 0] → stats over [1, 0]: z1 = [m, NaN, −m], m = .5/(sqrt(.5)+1e-4)
    #             r2 = [2, 4, NaN] → stats over [2, 4]: mean 3, std sqrt(2) → z2 = [−1/(sqrt2+ε), 1/(sqrt2+ε), NaN]
    # row 2 scored by r2 only; a fourth group row unscored by both → 0.
    r = torch.tensor([[1.0, 2.0], [NAN, 4.0], [0.0, NAN], [NAN, NAN], [1.0, 1.0], [0.0, 0.0]])
    a = mo(r, 3)
    m = 0.5 / (math.sqrt(0.5) + EPS)
    q = 1 / (math.sqrt(2) + EPS)
    # group 2 = [NaN row, (1,1), (0,0)]: r1 over [1,0]: ±m; r2 over [1,0]: ±m
    torch.testing.assert_close(a, torch.tensor([m - q, q, -m, 0.0, 2 * m, -2 * m]))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_reward_raises_naming_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='mo_grpo'.*infinite"):
        mo(torch.tensor([[0.0, 1.0], [bad, 0.0]]), 2)


def test_reward_weights_scale_the_zscores_and_must_match_k():
    r = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    m = 0.5 / (math.sqrt(0.5) + EPS)
    # z1 = [−m, m], z2 = [m, −m]; weights (2, 1) → [−m, m]
    torch.testing.assert_close(mo(r, 2, reward_weights=[2.0, 1.0]), torch.tensor([-m, m]))
    torch.testing.assert_close(mo(r, 2), torch.zeros(2))  # equal weights: the two objectives cancel
    with pytest.raises(ValueError, match="reward_weights has 3 entries for 2"):
        mo(r, 2, reward_weights=[1.0, 1.0, 1.0])


def test_registered_as_multi_reward_aggregator():
    v = trl_groupx.get_variant("mo_grpo")
    assert v.requires == ("rewards_per_func",) and v.flags == {"advantage_estimator": "mo_grpo"}
