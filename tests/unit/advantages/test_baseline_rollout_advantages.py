"""ReMax and AAPO advantages on hand-computed tensors: the extra baseline completion's reward enters as a `(N,)`
tensor aligned with the rollouts."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import aapo_advantages, group_normalized_advantages, remax_advantages

NAN = float("nan")


def config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **flags)


# ---- ReMax -----------------------------------------------------------------------------------------------------

def test_remax_subtracts_the_greedy_reward_of_each_prompt():
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0])
    greedy = torch.tensor([0.5, 0.5, 0.5, 0.0, 0.0, 0.0])  # two groups of 3: greedy 0.5 and 0.0
    # A = r − b: [0.5, −0.5, 0, 1, 0, 0]
    torch.testing.assert_close(remax_advantages(rewards, 3, greedy_baseline_rewards=greedy),
                               torch.tensor([0.5, -0.5, 0.0, 1.0, 0.0, 0.0]))


def test_remax_all_equal_group_still_learns_against_the_greedy_baseline():
    # all four sampled answers wrong, greedy right: every sample is pushed down by 1 (GRPO would give 0)
    out = remax_advantages(torch.zeros(4), 4, greedy_baseline_rewards=torch.ones(4))
    torch.testing.assert_close(out, -torch.ones(4))


@pytest.mark.parametrize("group_size", [1, 2])
def test_remax_small_groups(group_size):
    rewards = torch.tensor([1.0, 0.0])
    out = remax_advantages(rewards, group_size, greedy_baseline_rewards=torch.tensor([0.25, 0.25]))
    torch.testing.assert_close(out, torch.tensor([0.75, -0.25]))


def test_remax_nan_reward_or_nan_baseline_gives_zero():
    rewards = torch.tensor([NAN, 1.0, 1.0, 0.0])
    greedy = torch.tensor([0.0, 0.0, NAN, NAN])  # second group: unscorable greedy completion → no baseline
    torch.testing.assert_close(remax_advantages(rewards, 2, greedy_baseline_rewards=greedy),
                               torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_remax_rejects_inf_and_shape_mismatch():
    with pytest.raises(ValueError, match="remax.*infinite"):
        remax_advantages(torch.tensor([math.inf, 0.0]), 2, greedy_baseline_rewards=torch.zeros(2))
    with pytest.raises(ValueError, match="remax.*infinite"):
        remax_advantages(torch.zeros(2), 2, greedy_baseline_rewards=torch.tensor([0.0, -math.inf]))
    with pytest.raises(ValueError, match="one baseline per rollout"):
        remax_advantages(torch.zeros(4), 2, greedy_baseline_rewards=torch.zeros(2))


# ---- AAPO ------------------------------------------------------------------------------------------------------

def test_aapo_adds_the_clipped_reference_margin():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    ref = torch.tensor([0.0, 0.1, 0.0, 1.0])
    # group mean 0.5 → Â = [0.5, −0.5, −0.5, 0.5] (no std division by default)
    # r − r_ref = [1.0, −0.1, 0.0, 0.0] → clip to [−0.2, 0.28] = [0.28, −0.1, 0, 0]
    expected = torch.tensor([0.78, -0.6, -0.5, 0.5])
    torch.testing.assert_close(aapo_advantages(rewards, 4, reference_sample_rewards=ref), expected)


def test_aapo_clips_both_sides_and_scales_by_coef():
    rewards = torch.tensor([0.0, 0.0])
    ref = torch.tensor([1.0, -1.0])  # margins −1 → −0.2 and +1 → +0.28; all-equal group: Â = 0
    out = aapo_advantages(rewards, 2, reference_sample_rewards=ref, aapo_coef=0.5)
    torch.testing.assert_close(out, torch.tensor([-0.1, 0.14]))


def test_aapo_coef_zero_is_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.9])
    ref = torch.rand(6)
    out = aapo_advantages(rewards, 3, reference_sample_rewards=ref, aapo_coef=0.0, aapo_scale_rewards=True)
    torch.testing.assert_close(out, group_normalized_advantages(rewards, 3, scale_rewards="group"))
    out = aapo_advantages(rewards, 3, reference_sample_rewards=ref, aapo_coef=0.0)
    torch.testing.assert_close(out, group_normalized_advantages(rewards, 3, scale_rewards="none"))


def test_aapo_official_scale_rewards_divides_by_std_plus_1e_4():
    rewards = torch.tensor([1.0, 0.0])
    ref = torch.tensor([1.0, 0.0])  # zero margin
    std = math.sqrt(0.5)  # unbiased std of {1, 0}
    out = aapo_advantages(rewards, 2, reference_sample_rewards=ref, aapo_scale_rewards=True)
    torch.testing.assert_close(out, torch.tensor([0.5 / (std + 1e-4), -0.5 / (std + 1e-4)]))


def test_aapo_group_size_one_keeps_only_the_margin():
    out = aapo_advantages(torch.tensor([1.0, 0.0]), 1, reference_sample_rewards=torch.tensor([0.9, 0.1]))
    torch.testing.assert_close(out, torch.tensor([0.1, -0.1]))


def test_aapo_nan_reward_gets_zero_and_nan_reference_adds_no_margin():
    rewards = torch.tensor([NAN, 1.0, 0.0, 1.0])
    ref = torch.tensor([0.0, NAN, 0.0, 0.0])
    # group 1: only r=1 scored → Â = 0, margin NaN → 0; group 2: Â = [−0.5, 0.5], margins [0, 0.28]
    torch.testing.assert_close(aapo_advantages(rewards, 2, reference_sample_rewards=ref),
                               torch.tensor([0.0, 0.0, -0.5, 0.78]))


def test_aapo_rejects_inf_and_shape_mismatch():
    with pytest.raises(ValueError, match="aapo.*infinite"):
        aapo_advantages(torch.tensor([0.0, math.inf]), 2, reference_sample_rewards=torch.zeros(2))
    with pytest.raises(ValueError, match="one reference sample per rollout"):
        aapo_advantages(torch.zeros(4), 2, reference_sample_rewards=torch.zeros(2))


# ---- config-time errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", [{"aapo_clip_low": -0.1}, {"aapo_clip_high": math.nan}, {"aapo_coef": True}])
def test_aapo_bad_flags_fail_at_config(flag):
    with pytest.raises(ValueError, match=next(iter(flag))):
        config(advantage_estimator="aapo", **flag)


@pytest.mark.parametrize("estimator", ["remax", "aapo"])
def test_vllm_is_refused_at_config(estimator):
    with pytest.raises(ValueError, match=rf"advantage_estimator='{estimator}'.*use_vllm=False"):
        config(advantage_estimator=estimator, use_vllm=True)


def test_aapo_flags_without_the_estimator_are_an_error():
    with pytest.raises(ValueError, match="aapo_coef"):
        config(aapo_coef=0.5)
