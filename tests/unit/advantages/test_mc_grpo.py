"""MC-GRPO: median baseline over odd groups, the pivot left out; hand-derived values and the edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages.mc_grpo import mc_grpo_advantages

BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
NAN = math.nan


def test_catalog_check():
    # G+1 = 3, rewards [0, 1, 1] → median 1 → A = [-1, 0, 0]; the pivot (first rollout at the median) is excluded
    adv, keep = mc_grpo_advantages(torch.tensor([0.0, 1.0, 1.0]), 3, mc_grpo_scale="none")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 0.0]))
    assert keep.tolist() == [True, False, True] and keep.sum() == 2  # G = 2 rollouts contribute


def test_mad_scale_matches_the_official_formula():
    # [0.2, 0.5, 1.0]: median 0.5, |r - med| = [0.3, 0, 0.5] → MAD 0.3; A = (r - 0.5) / (0.3 + 1e-3)
    adv, keep = mc_grpo_advantages(torch.tensor([0.2, 0.5, 1.0]), 3, mc_grpo_scale="mad")
    torch.testing.assert_close(adv, torch.tensor([-0.3, 0.0, 0.5]) / 0.301)
    assert keep.tolist() == [True, False, True]
    # binary rewards: MAD = 0 → the minority rollout gets ±1/1e-3 (the official code's behaviour)
    adv, _ = mc_grpo_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, mc_grpo_scale="mad")
    torch.testing.assert_close(adv, torch.tensor([1000.0, 0.0, 0.0]))


def test_groups_are_independent_and_all_equal_group_is_zero():
    adv, keep = mc_grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 3.0, 1.0, 2.0, 5.0, 4.0]), 3,
                                   mc_grpo_scale="none")
    # group 1 all equal: zeros, pivot = first; group 2 median 1; group 3 median 4
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.0, -1.0, 2.0, 0.0, -2.0, 1.0, 0.0]))
    assert keep.tolist() == [False, True, True, True, True, False, True, True, False]


def test_unscored_rollouts_get_zero_and_are_never_the_pivot():
    adv, keep = mc_grpo_advantages(torch.tensor([NAN, 1.0, 0.0, NAN, NAN, NAN]), 3, mc_grpo_scale="none")
    # scored [1, 0]: torch's nanmedian takes the lower middle value, 0 → A = [0, 1, 0], pivot = rollout 2
    torch.testing.assert_close(adv, torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    assert keep.tolist() == [True, True, False, True, True, True]  # the unscored group has no pivot


def test_group_of_one():
    adv, keep = mc_grpo_advantages(torch.tensor([0.7, 0.1]), 1, mc_grpo_scale="mad")
    torch.testing.assert_close(adv, torch.zeros(2))
    assert not keep.any()  # each rollout is its own median


def test_errors():
    with pytest.raises(ValueError, match="infinite reward"):
        mc_grpo_advantages(torch.tensor([0.0, math.inf, 1.0]), 3, mc_grpo_scale="none")
    with pytest.raises(ValueError, match="mc_grpo_scale must be one of"):
        mc_grpo_advantages(torch.zeros(3), 3, mc_grpo_scale="std")
    with pytest.raises(ValueError, match="needs an odd group.*num_generations=8 is even.*e.g. 9"):
        GRPOConfig(**BASE, advantage_estimator="mc_grpo", num_generations=8, per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="mc_grpo_scale must be one of"):
        GRPOConfig(**BASE, advantage_estimator="mc_grpo", num_generations=3, per_device_train_batch_size=3,
                   mc_grpo_scale="std")
    GRPOConfig(**BASE, advantage_estimator="mc_grpo", num_generations=3, per_device_train_batch_size=3)
