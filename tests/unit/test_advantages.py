"""Advantage-stage formulas on hand-computed tensors (derivations in the comments)."""

import math

import pytest
import torch

from trl_groupx.advantages import decoupled_normalized_advantages, group_normalized_advantages, sign_advantages

NAN = float("nan")


class TestGroupNormalized:
    def test_hand_values(self):
        # [0,1,1,0]: mean 0.5, unbiased std sqrt(4·0.25/3) = sqrt(1/3) → A = ±0.5/(sqrt(1/3)+1e-4)
        a = group_normalized_advantages(torch.tensor([0.0, 1.0, 1.0, 0.0]), 4)
        m = 0.5 / (math.sqrt(1 / 3) + 1e-4)
        torch.testing.assert_close(a, torch.tensor([-m, m, m, -m]))

    def test_groups_are_independent_and_all_equal_group_is_zero(self):
        a = group_normalized_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2)
        # group 1 all-equal → 0; group 2 [0,1]: std sqrt(0.5) → ±0.5/(sqrt(.5)+1e-4)
        m = 0.5 / (math.sqrt(0.5) + 1e-4)
        torch.testing.assert_close(a, torch.tensor([0.0, 0.0, -m, m]))

    def test_nan_reward_is_excluded_and_gets_zero(self):
        # group [1, NaN, 0]: stats over [1, 0] only: mean .5, std sqrt(.5)
        a = group_normalized_advantages(torch.tensor([1.0, NAN, 0.0]), 3)
        m = 0.5 / (math.sqrt(0.5) + 1e-4)
        torch.testing.assert_close(a, torch.tensor([m, 0.0, -m]))

    def test_scale_none_and_batch(self):
        r = torch.tensor([0.0, 2.0, 1.0, 1.0])
        torch.testing.assert_close(group_normalized_advantages(r, 2, scale_rewards="none"), torch.tensor([-1.0, 1.0, 0, 0]))
        # batch std of [0,2,1,1]: mean 1, unbiased var (1+1+0+0)/3
        s = math.sqrt(2 / 3) + 1e-4
        torch.testing.assert_close(
            group_normalized_advantages(r, 2, scale_rewards="batch"), torch.tensor([-1 / s, 1 / s, 0.0, 0.0])
        )

    def test_group_size_one_gives_zero(self):
        torch.testing.assert_close(group_normalized_advantages(torch.tensor([0.3, 0.9]), 1), torch.zeros(2))

    def test_bad_scale_and_bad_group_size(self):
        with pytest.raises(ValueError, match="scale_rewards"):
            group_normalized_advantages(torch.zeros(4), 2, scale_rewards="rank")
        with pytest.raises(ValueError, match="groups of 3"):
            group_normalized_advantages(torch.zeros(4), 3)


class TestDecoupled:
    def test_catalog_check_two_rewards(self):
        # G=2; group A rows (0,0),(1,0); group B rows (0,0),(1,1).
        r = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
        z = 0.5 / (math.sqrt(0.5) + 1e-4)  # per-function group z-score of [0, 1]
        summed = torch.tensor([-z, z, -2 * z, 2 * z])  # B is twice A before the batch normalisation
        std = math.sqrt((2 * z**2 + 2 * (2 * z) ** 2) / 3) + 1e-4
        torch.testing.assert_close(decoupled_normalized_advantages(r, 2), summed / std)

    def test_unscored_row_is_zero(self):
        r = torch.tensor([[0.0, 1.0], [1.0, 0.0], [NAN, NAN], [1.0, 1.0]])
        a = decoupled_normalized_advantages(r, 2)
        assert a[2] == 0 and torch.isfinite(a).all()

    def test_requires_matrix(self):
        with pytest.raises(ValueError, match="per-function rewards"):
            decoupled_normalized_advantages(torch.zeros(4), 2)


class TestSign:
    @pytest.mark.parametrize(
        "rewards, expected",
        [([1, 1, 1, 1], [1, 1, 1, 1]), ([0, 0, 0, 0], [-1, -1, -1, -1]), ([0, 1], [-1, 1]), ([0.25], [-0.5])],
    )
    def test_catalog_values(self, rewards, expected):
        r = torch.tensor(rewards, dtype=torch.float32)
        torch.testing.assert_close(sign_advantages(r, len(rewards)), torch.tensor(expected, dtype=torch.float32))

    def test_independent_of_group_and_neighbours(self):
        a = sign_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
        b = sign_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), 4)
        assert a[0] == b[0] == 1 and a[2] == b[2]

    def test_nan_is_zero(self):
        torch.testing.assert_close(sign_advantages(torch.tensor([NAN, 1.0]), 2), torch.tensor([0.0, 1.0]))

    def test_out_of_range_names_the_flag(self):
        with pytest.raises(ValueError, match="advantage_estimator='sign_adv'.*\\[0, 1\\]"):
            sign_advantages(torch.tensor([0.0, 2.0]), 2)
