"""Blockwise advantages with the Outcome-Conditioned Baseline, hand-derived.

One group of G=4, K=2 blocks (block 0 = answer, scored by correctness r0; block 1 = confidence, scored by r1):

| i | r0 | r1  | A0 = r0 − mean r0 | stratum of i (same r0) | A1 = r1 − mean(r1 | stratum) |
| 0 | 1  | 0.9 | +0.5              | {0, 1}: mean 0.7       | +0.2                          |
| 1 | 1  | 0.5 | +0.5              | {0, 1}                 | −0.2                          |
| 2 | 0  | 0.4 | −0.5              | {2, 3}: mean 0.2       | +0.2                          |
| 3 | 0  | 0.0 | −0.5              | {2, 3}                 | −0.2                          |

Plain GRPO on r1 would give r1 − 0.45 = [+0.45, +0.05, −0.05, −0.45]: the conditioned baseline removes the part
of r1 explained by correctness. With scaling, std(r0) = sqrt((4 · 0.25)/3) = 0.577350 and
std(r1) = sqrt((0.45² + 0.05² + 0.05² + 0.45²)/3) = sqrt(0.41/3) = 0.369685 (Bessel), each + 1e-4.
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import blockwise_adv_token_advantages
from trl_groupx.token_weights.blockwise_adv import outcome_conditioned_advantages

NAN = float("nan")
R = torch.tensor([[1.0, 0.9], [1.0, 0.5], [0.0, 0.4], [0.0, 0.0]])
# 6 tokens: 3 in block 0, 2 in block 1, 1 outside (after </confidence>); row 3 is shorter (padding at the end)
BLOCKS = torch.tensor([[0, 0, 0, 1, 1, -1]] * 3 + [[0, 0, 1, -1, -1, -1]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1]] * 3 + [[1, 1, 1, 0, 0, 0]])


def ctx(rewards=R, blocks=BLOCKS, mask=MASK, g=4):
    return TokenContext(mask, g, rewards_per_func=rewards, token_blocks=blocks, rewards=rewards.nansum(1))


def test_block_advantages_unscaled():
    adv = outcome_conditioned_advantages(R, 4, scale_rewards=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.2], [0.5, -0.2], [-0.5, 0.2], [-0.5, -0.2]]))


def test_block_advantages_scaled_by_group_std():
    adv = outcome_conditioned_advantages(R, 4, scale_rewards=True)
    s0, s1 = math.sqrt(1 / 3) + 1e-4, math.sqrt(0.41 / 3) + 1e-4
    expected = torch.tensor([[0.5 / s0, 0.2 / s1], [0.5 / s0, -0.2 / s1], [-0.5 / s0, 0.2 / s1],
                             [-0.5 / s0, -0.2 / s1]])
    torch.testing.assert_close(adv, expected)


def test_tokens_get_only_their_block_advantage():
    out = blockwise_adv_token_advantages(torch.zeros(4), ctx(), blockwise_adv_scale_rewards=False)
    expected = torch.tensor([
        [0.5, 0.5, 0.5, 0.2, 0.2, 0.0],
        [0.5, 0.5, 0.5, -0.2, -0.2, 0.0],
        [-0.5, -0.5, -0.5, 0.2, 0.2, 0.0],
        [-0.5, -0.5, -0.2, 0.0, 0.0, 0.0],  # row 3: two block-0 tokens, one block-1 token, then padding
    ])
    torch.testing.assert_close(out, expected)


def test_block_zero_never_sees_the_second_reward():
    # change only r1: block-0 tokens keep exactly the same advantages
    other = R.clone()
    other[:, 1] = torch.tensor([0.0, 1.0, 0.3, 0.7])
    a = blockwise_adv_token_advantages(torch.zeros(4), ctx(), blockwise_adv_scale_rewards=True)
    b = blockwise_adv_token_advantages(torch.zeros(4), ctx(other), blockwise_adv_scale_rewards=True)
    in_block0 = BLOCKS == 0
    torch.testing.assert_close(a[in_block0], b[in_block0])
    assert not torch.allclose(a[BLOCKS == 1], b[BLOCKS == 1])


def test_all_equal_group_gives_zero():
    rewards = torch.tensor([[1.0, 0.5]] * 4)
    out = blockwise_adv_token_advantages(torch.zeros(4), ctx(rewards), blockwise_adv_scale_rewards=True)
    assert torch.equal(out, torch.zeros(4, 6))


def test_group_size_one_gives_zero():
    out = outcome_conditioned_advantages(R, 1, scale_rewards=True)
    assert torch.equal(out, torch.zeros(4, 2))


def test_group_size_two_singleton_strata_give_zero_on_block_one():
    # one group of two with different outcomes: each rollout is alone in its stratum
    rewards = torch.tensor([[1.0, 0.8], [0.0, 0.3]])
    adv = outcome_conditioned_advantages(rewards, 2, scale_rewards=False)
    # block 0: ±0.5; block 1: each rollout is alone in its stratum → r1 − r1 = 0
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0], [-0.5, 0.0]]))


def test_nan_rewards():
    # r0 = [1, NaN, 0, 0]: block 0 mean over {1, 0, 0} = 1/3 → [2/3, 0 (unscored), −1/3, −1/3]
    # r1 = [0.9, 0.2, NaN, 0.1]:
    #   row 0: stratum r0 = 1 → {0} → 0.9 − 0.9 = 0
    #   row 1: its outcome r0 is NaN → group mean of the scored r1 = (0.9 + 0.2 + 0.1)/3 = 0.4
    #          → 0.2 − 0.4 = −0.2
    #   row 2: r1 NaN → 0;   row 3: stratum r0 = 0 → {2, 3}, scored {3} → 0.1 − 0.1 = 0
    rewards = torch.tensor([[1.0, 0.9], [NAN, 0.2], [0.0, NAN], [0.0, 0.1]])
    adv = outcome_conditioned_advantages(rewards, 4, scale_rewards=False)
    torch.testing.assert_close(adv, torch.tensor([[2 / 3, 0.0], [0.0, -0.2], [-1 / 3, 0.0], [-1 / 3, 0.0]]))
    out = blockwise_adv_token_advantages(torch.zeros(4), ctx(rewards), blockwise_adv_scale_rewards=True)
    assert torch.isfinite(out).all() and (out[1, :3] == 0).all() and (out[2, 3:5] == 0).all()


def test_padding_is_never_read():
    # block ids and rewards of padded positions cannot change anything: give padding a block id
    blocks = BLOCKS.clone()
    blocks[3, 3:] = 1
    out = blockwise_adv_token_advantages(torch.zeros(4), ctx(blocks=blocks), blockwise_adv_scale_rewards=False)
    assert (out[MASK == 0] == 0).all()


def test_infinite_reward_is_an_error():
    rewards = R.clone()
    rewards[0, 1] = float("inf")
    with pytest.raises(ValueError, match="±inf"):
        blockwise_adv_token_advantages(torch.zeros(4), ctx(rewards), blockwise_adv_scale_rewards=True)


def test_more_blocks_than_rewards_is_an_error():
    with pytest.raises(ValueError, match="only 1 reward"):
        blockwise_adv_token_advantages(torch.zeros(4), ctx(R[:, :1]), blockwise_adv_scale_rewards=True)


def test_config_validation():
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="blockwise_adv")
    GRPOConfig(**common)
    with pytest.raises(ValueError, match="blockwise_adv_block_tags"):
        GRPOConfig(**common, blockwise_adv_block_tags=["<answer>", "confidence"])
    with pytest.raises(ValueError, match="blockwise_adv_scale_rewards"):
        GRPOConfig(**common, blockwise_adv_scale_rewards="yes")
    with pytest.raises(ValueError, match="scale_rewards"):
        GRPOConfig(**common, scale_rewards="none")
    with pytest.raises(ValueError, match="gmpo"):
        GRPOConfig(**common, loss_type="gmpo")
    with pytest.raises(ValueError, match="belongs to variant 'blockwise_adv'"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, blockwise_adv_block_tags=["a", "b"])
