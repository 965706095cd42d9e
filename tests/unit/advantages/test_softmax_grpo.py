"""SoftmaxGRPO advantages A = M·softmax(r/τ) − 1 on hand-derived numbers and every edge case."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import group_normalized_advantages, softmax_grpo_advantages

NAN, INF = float("nan"), float("inf")


def sm(r, g, tau=0.3):
    return softmax_grpo_advantages(torch.tensor(r, dtype=torch.float32), g, softmax_grpo_temperature=tau)


def test_lone_success_in_eight_hand_value():
    # c = e^{1/0.3}; weights c/(c+7) and 1/(c+7); A = 8w - 1  → +5.40 and -0.77 (official-code.md note)
    c = math.exp(1 / 0.3)
    expected = torch.tensor([8 * c / (c + 7) - 1] + [8 / (c + 7) - 1] * 7)
    a = sm([1, 0, 0, 0, 0, 0, 0, 0], 8)
    torch.testing.assert_close(a, expected)
    assert abs(a[0].item() - 5.40) < 5e-3


def test_official_fixture_binary_formula():
    # Official tests/test_advantage.py::test_binary_formula_and_stop_gradient: [0,1,0,1], τ=0.3, M=4:
    # failures 4/(2+2c) - 1, successes 4c/(2+2c) - 1; the group sums to 0.
    c = math.exp(1 / 0.3)
    a = sm([0, 1, 0, 1], 4)
    torch.testing.assert_close(a, torch.tensor([4 / (2 + 2 * c) - 1, 4 * c / (2 + 2 * c) - 1] * 2))
    assert abs(a.sum().item()) < 1e-6


def test_official_fixture_shift_invariance_and_tiny_temperature():
    # Official test_constant_singleton_shift_and_extreme_temperature: shift invariance, τ→0 puts all weight on the
    # argmax: [-2, 0, 1] → [-1, -1, 2].
    r = torch.tensor([-2.0, 0.0, 1.0])
    torch.testing.assert_close(softmax_grpo_advantages(r, 3, softmax_grpo_temperature=0.2),
                               softmax_grpo_advantages(r + 10, 3, softmax_grpo_temperature=0.2))
    torch.testing.assert_close(sm([-2, 0, 1], 3, tau=1e-20), torch.tensor([-1.0, -1.0, 2.0]))


def test_weights_in_unit_interval_sum_to_one_and_bounds():
    torch.manual_seed(0)
    r = torch.rand(64)
    a = softmax_grpo_advantages(r, 8, softmax_grpo_temperature=0.3)
    w = (a + 1) / 8  # weights recovered from A = M w - 1
    assert ((w >= 0) & (w <= 1)).all()
    torch.testing.assert_close(w.view(8, 8).sum(1), torch.ones(8))
    assert (a >= -1).all() and (a <= 7).all()


def test_bounded_where_zscore_diverges():
    # [1,1,1,0]: z-score gives −1.5/(…) ≈ −1.5 for the lone failure; softmax keeps it ≥ −1:
    # c = e^{1/0.3}; lone failure 4/(3c+1) − 1 ≈ −0.953, each success 4c/(3c+1) − 1 ≈ 0.318.
    c = math.exp(1 / 0.3)
    a = sm([1, 1, 1, 0], 4)
    torch.testing.assert_close(a, torch.tensor([4 * c / (3 * c + 1) - 1] * 3 + [4 / (3 * c + 1) - 1]))
    z = group_normalized_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), 4)
    assert z[3] < -1.49 and a[3] > -1


def test_all_equal_group_and_group_sizes_one_and_two():
    assert torch.equal(sm([0.7, 0.7, 0.7, 0.7], 4), torch.zeros(4))
    assert torch.equal(sm([0.3, 0.9, 0.1], 1), torch.zeros(3))  # G=1: 1·1 − 1
    # G=2, [1, 0]: w = c/(c+1), 1/(c+1) → A = ±(c−1)/(c+1) (equal and opposite)
    c = math.exp(1 / 0.3)
    torch.testing.assert_close(sm([1, 0, 0, 0], 2), torch.tensor([(c - 1) / (c + 1), -(c - 1) / (c + 1), 0, 0]))


def test_nan_excluded_and_zero():
    # group [1, NaN, 0, 0]: M = 3 scored, weights over {1, 0, 0} → same as group [1, 0, 0] of three
    a = sm([1, NAN, 0, 0, NAN, NAN, NAN, NAN], 4)
    ref = sm([1, 0, 0], 3)
    torch.testing.assert_close(a[[0, 2, 3]], ref)
    assert a[1] == 0 and (a[4:] == 0).all() and torch.isfinite(a).all()


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='softmax_grpo'.*infinite"):
        sm([1.0, bad, 0.0, 0.0], 4)


def test_float64_and_small_tau_stay_finite():
    a = softmax_grpo_advantages(torch.tensor([0.0, 100.0], dtype=torch.float64), 2, softmax_grpo_temperature=1e-3)
    assert a.dtype == torch.float64 and torch.equal(a, torch.tensor([-1.0, 1.0], dtype=torch.float64))


def test_groups_independent_and_shape_error():
    a = sm([1, 0, 0.5, 0.5], 2)
    torch.testing.assert_close(a[:2], sm([1, 0], 2)) and torch.testing.assert_close(a[2:], torch.zeros(2))
    with pytest.raises(ValueError, match="groups of 3"):
        sm([1, 0, 0, 0], 3)


@pytest.mark.parametrize("tau", [0.0, -0.1, NAN, INF])
def test_bad_temperature_names_the_flag(tau):
    with pytest.raises(ValueError, match="softmax_grpo_temperature"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="softmax_grpo",
                   softmax_grpo_temperature=tau)


def test_temperature_needs_the_variant():
    with pytest.raises(ValueError, match="softmax_grpo_temperature.*not switched on"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, softmax_grpo_temperature=0.1)
