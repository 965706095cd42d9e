"""The std dial: bit-exact identity with TRL's scale_rewards, the group-standard-deviation identity, edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import group_normalized_advantages, std_dial_advantages

NAN, INF = float("nan"), float("inf")
BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)


def dial(r, g, mode):
    return std_dial_advantages(torch.tensor(r, dtype=torch.float32), g, std_dial_mode=mode)


def test_hand_values():
    # [0,1,1,0]: mean .5, unbiased std sqrt(1/3) → divide ±.5/(sqrt(1/3)+1e-4); none ±.5
    m = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    torch.testing.assert_close(dial([0, 1, 1, 0], 4, "divide"), torch.tensor([-m, m, m, -m]))
    torch.testing.assert_close(dial([0, 1, 1, 0], 4, "none"), torch.tensor([-0.5, 0.5, 0.5, -0.5]))


@pytest.mark.parametrize("mode, scale", [("divide", "group"), ("none", "none")])
def test_identity_with_trl_scale_rewards_bit_exact(mode, scale):
    torch.manual_seed(0)
    r = torch.rand(32)
    r[7] = NAN
    ours = std_dial_advantages(r, 8, std_dial_mode=mode)
    assert torch.equal(ours, group_normalized_advantages(r, 8, scale_rewards=scale))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_group_std_identity_for_binary_rewards(k):
    # G = 8, p = k/8: Σ A² = (G−1)·std² under "none" (∝ std², max at p = 1/2); ≈ G−1 under "divide" for every p
    g = 8
    r = torch.tensor([1.0] * k + [0.0] * (g - k))
    std = r.std().item()
    none, divide = std_dial_advantages(r, g, std_dial_mode="none"), std_dial_advantages(r, g, std_dial_mode="divide")
    assert math.isclose((none**2).sum().item(), (g - 1) * std**2, rel_tol=1e-5)
    assert math.isclose((divide**2).sum().item(), (g - 1) * (std / (std + 1e-4)) ** 2, rel_tol=1e-5)
    assert abs((divide**2).sum().item() - (g - 1)) < 1e-2


def test_unanimous_groups_silent_in_both_modes_and_group_sizes():
    for mode in ("divide", "none"):
        assert torch.equal(dial([1, 1, 1, 1, 0, 0, 0, 0], 4, mode), torch.zeros(8))
        assert torch.equal(dial([1, 0, 0.5], 1, mode), torch.zeros(3))  # G = 1
    m = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(dial([1, 0], 2, "divide"), torch.tensor([m, -m]))
    torch.testing.assert_close(dial([1, 0], 2, "none"), torch.tensor([0.5, -0.5]))


def test_nan_excluded_and_zero():
    # [1, NaN, 0]: stats over {1, 0}
    torch.testing.assert_close(dial([1, NAN, 0], 3, "none"), torch.tensor([0.5, 0.0, -0.5]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='std_dial'.*infinite"):
        dial([1.0, bad], 2, "divide")


def test_modes_are_validated():
    GRPOConfig(**BASE, advantage_estimator="std_dial", std_dial_mode="none")
    with pytest.raises(ValueError, match="std_dial_mode must be one of.*sampling-stage filter"):
        GRPOConfig(**BASE, advantage_estimator="std_dial", std_dial_mode="drop_zero")
    with pytest.raises(ValueError, match="std_dial_mode must be one of"):
        GRPOConfig(**BASE, advantage_estimator="std_dial", std_dial_mode="batch")
    with pytest.raises(ValueError, match="std_dial_mode.*not switched on"):
        GRPOConfig(**BASE, std_dial_mode="none")
