"""DVAO (our reading of the abstract, see the docstring): per-group weights ∝ c_k σ_gk^p over per-reward z-scores.
Derivations in the comments."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.advantages.dvao import dvao_advantages as dvao

NAN = float("nan")
EPS = 1e-4


def test_hand_values_variance_weights():
    # one group G=2: r1 = [0, 1] (σ1 = sqrt(.5), var .5), r2 = [0, 3] (σ2 = 3 sqrt(.5), var 4.5).
    # z1 = ∓.5/(sqrt(.5)+ε), z2 = ∓1.5/(3 sqrt(.5)+ε); p=2: w = [.5, 4.5]/5 = [.1, .9]
    r = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    z1 = 0.5 / (math.sqrt(0.5) + EPS)
    z2 = 1.5 / (3 * math.sqrt(0.5) + EPS)
    a = 0.1 * z1 + 0.9 * z2
    torch.testing.assert_close(dvao(r, 2), torch.tensor([-a, a]))
    # p=1: w = [1, 3]/4
    a1 = 0.25 * z1 + 0.75 * z2
    torch.testing.assert_close(dvao(r, 2, dvao_variance_power=1.0), torch.tensor([-a1, a1]))


def test_catalog_check_constant_reward_gets_weight_zero_per_group():
    # group 1: r2 constant → w = (1, 0): A = z1. group 2: r1 constant → A = z2 (weights are per group)
    r = torch.tensor([[0.0, 5.0], [1.0, 5.0], [2.0, 0.0], [2.0, 7.0]])
    m1 = 0.5 / (math.sqrt(0.5) + EPS)
    m2 = 3.5 / (7 * math.sqrt(0.5) + EPS)
    torch.testing.assert_close(dvao(r, 2), torch.tensor([-m1, m1, -m2, m2]))


def test_catalog_check_bounded_for_any_reward_scale():
    gen = torch.Generator().manual_seed(0)
    g = 8
    bound = (g - 1) / math.sqrt(g)  # Samuelson: |z| ≤ (n−1)/sqrt(n) with the unbiased std
    for scale in (1e-3, 1.0, 1e3, 1e6):
        r = torch.rand(4 * g, 3, generator=gen) * torch.tensor([1.0, scale, 10.0])
        assert dvao(r, g).abs().max() <= bound + 1e-4


def test_single_reward_is_grpo():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.2, 0.4, 0.9, 0.9])
    torch.testing.assert_close(dvao(r, 4), group_normalized_advantages(r, 4))


def test_all_equal_group_group_size_one_and_two():
    torch.testing.assert_close(dvao(torch.ones(4, 2), 2), torch.zeros(4))
    torch.testing.assert_close(dvao(torch.tensor([[0.3, 1.0], [0.9, 0.0]]), 1), torch.zeros(2))
    # G=2 with equal spreads: w = (.5, .5), z's agree → ±m
    m = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(dvao(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), 2), torch.tensor([-m, m]))


def test_nan_entries_excluded_and_unscored_rows_zero():
    # group of 3: r1 = [0, NaN, 1] (σ1 = sqrt(.5)), r2 = [0, 1, NaN] (σ2 = sqrt(.5)) → w = (.5, .5)
    # z1 = [−m, ·, m], z2 = [−m, m, ·] → A = [−m, m/2, m/2]; an all-NaN row in group 2 gets 0
    r = torch.tensor([[0.0, 0.0], [NAN, 1.0], [1.0, NAN], [NAN, NAN], [0.0, 0.0], [1.0, 1.0]])
    m = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(dvao(r, 3), torch.tensor([-m, m / 2, m / 2, 0.0, -m, m]))


def test_target_weights_and_bad_values():
    r = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # equal spreads, opposite directions
    m = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(dvao(r, 2), torch.zeros(2))  # w = (.5, .5) cancel
    torch.testing.assert_close(dvao(r, 2, reward_weights=[3.0, 1.0]), torch.tensor([-m / 2, m / 2]))  # w = (.75,.25)
    with pytest.raises(ValueError, match="non-negative reward_weights"):
        dvao(r, 2, reward_weights=[1.0, -1.0])


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_reward_raises_naming_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='dvao'.*infinite"):
        dvao(torch.tensor([[0.0, 1.0], [bad, 0.0]]), 2)


def test_validate_power():
    assert trl_groupx.get_variant("dvao").requires == ("rewards_per_func",)
    with pytest.raises(ValueError, match="dvao_variance_power must be > 0"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="dvao",
                              dvao_variance_power=0.0)
