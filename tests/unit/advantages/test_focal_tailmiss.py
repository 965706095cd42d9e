"""F-GRPO focal scaling A = Â·(1 − p̂)^γ on hand-derived numbers, the catalog's checks and the edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import focal_tailmiss_advantages, group_normalized_advantages

NAN, INF = float("nan"), float("inf")
BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)


def focal(r, g, gamma=0.5, **kw):
    return focal_tailmiss_advantages(torch.tensor(r, dtype=torch.float32), g, focal_tailmiss_gamma=gamma, **kw)


def test_hand_values_quarter_and_three_quarters():
    # group A [1,0,0,0]: p̂ = 1/4, mean .25, unbiased std sqrt((.75²+3·.25²)/3) = sqrt(.25) = .5
    #   Â = [.75, -.25, -.25, -.25]/(.5+1e-4); weight (3/4)^.5
    # group B [1,1,1,0]: p̂ = 3/4, Â = [.25, .25, .25, -.75]/(.5+1e-4); weight (1/4)^.5 = .5
    s = 0.5 + 1e-4
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]) / s
    expected[:4] *= math.sqrt(0.75)
    expected[4:] *= 0.5
    torch.testing.assert_close(focal([1, 0, 0, 0, 1, 1, 1, 0], 4), expected)


def test_weight_of_easy_group_is_smaller():
    # catalog: groups with p̂ = 1/4 vs 3/4 → weight(3/4) < weight(1/4); weight = A/Â per group
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    w = focal_tailmiss_advantages(r, 4, focal_tailmiss_gamma=0.5) / group_normalized_advantages(r, 4)
    assert torch.allclose(w[:4], torch.full((4,), math.sqrt(0.75))) and torch.allclose(w[4:], torch.full((4,), 0.5))
    assert w[4] < w[0]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_gamma_zero_reproduces_base_bit_exactly(scale):
    torch.manual_seed(0)
    r = (torch.rand(32) > 0.5).float()
    r[5] = NAN
    assert torch.equal(focal_tailmiss_advantages(r, 8, focal_tailmiss_gamma=0.0, scale_rewards=scale),
                       group_normalized_advantages(r, 8, scale_rewards=scale))
    frac = torch.rand(32)
    assert torch.equal(focal_tailmiss_advantages(frac, 4, focal_tailmiss_gamma=0.0, scale_rewards=scale),
                       group_normalized_advantages(frac, 4, scale_rewards=scale))


def test_scale_none_is_dr_grpo_times_weight():
    # [1,0]: Â = ±.5 (no std), p̂ = .5 → weight .5^1 = .5 at γ = 1
    torch.testing.assert_close(focal([1, 0], 2, gamma=1.0, scale_rewards="none"), torch.tensor([0.25, -0.25]))


def test_all_equal_groups_stay_zero_and_weight_depends_only_on_group():
    assert torch.equal(focal([1, 1, 1, 1, 0, 0, 0, 0, 0.4, 0.4, 0.4, 0.4], 4), torch.zeros(12))
    # the same group vector gives the same advantages whatever the neighbours are (group std scaling)
    a = focal([1, 0, 0, 0, 1, 1, 1, 1], 4)
    b = focal([1, 0, 0, 0, 0, 0, 0, 0], 4)
    assert torch.equal(a[:4], b[:4])


def test_group_sizes_one_and_two():
    assert torch.equal(focal([1, 0, 0.5], 1), torch.zeros(3))  # G = 1: Â = 0
    # G = 2 [1, 0]: Â = ±.5/(sqrt(.5)+1e-4), p̂ = .5 → weight sqrt(.5)
    m = 0.5 / (math.sqrt(0.5) + 1e-4) * math.sqrt(0.5)
    torch.testing.assert_close(focal([1, 0, 1, 1], 2), torch.tensor([m, -m, 0, 0]))


def test_nan_excluded_from_stats_and_success_rate():
    # group [1, NaN, 0, 0]: Â over {1,0,0}: mean 1/3, std sqrt((4/9+1/9+1/9)/2)=sqrt(1/3); p̂ = 1/3 → w = (2/3)^.5
    s = math.sqrt(1 / 3) + 1e-4
    w = math.sqrt(2 / 3)
    expected = torch.tensor([(2 / 3) / s * w, 0.0, -(1 / 3) / s * w, -(1 / 3) / s * w, 0, 0, 0, 0])
    a = focal([1, NAN, 0, 0, NAN, NAN, NAN, NAN], 4)
    torch.testing.assert_close(a, expected)
    assert torch.isfinite(a).all()


def test_success_threshold_for_composite_rewards():
    # rewards accuracy+format in [0, 2]; threshold 1.5 → successes {1.8}: p̂ = 1/4 → w = (3/4)^.5
    r = [1.8, 0.2, 0.0, 1.0]
    a = focal(r, 4, focal_tailmiss_success_threshold=1.5)
    base = group_normalized_advantages(torch.tensor(r), 4)
    torch.testing.assert_close(a, base * math.sqrt(0.75))


def test_rewards_outside_unit_interval_need_threshold():
    with pytest.raises(ValueError, match="advantage_estimator='focal_tailmiss'.*\\[0, 1\\].*threshold"):
        focal([2.0, 0.0], 2)


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='focal_tailmiss'.*infinite"):
        focal([1.0, bad], 2, focal_tailmiss_success_threshold=0.5)


@pytest.mark.parametrize("flags, message", [
    (dict(focal_tailmiss_gamma=-0.5), "focal_tailmiss_gamma must be"),
    (dict(focal_tailmiss_gamma=NAN), "focal_tailmiss_gamma must be"),
    (dict(focal_tailmiss_success_threshold=INF), "focal_tailmiss_success_threshold must be"),
])
def test_bad_config_names_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**BASE, advantage_estimator="focal_tailmiss", **flags)


def test_params_need_the_variant():
    with pytest.raises(ValueError, match="focal_tailmiss_gamma.*not switched on"):
        GRPOConfig(**BASE, focal_tailmiss_gamma=1.0)
