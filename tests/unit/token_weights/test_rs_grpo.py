"""RS-GRPO: per-scope group normalisation and the official scope-averaged loss, hand-derived and against a fixture
transcribed from OpenBMB/VisRAG@f35d232d4c6c7350e12e0f72911404dbae4042ab (src/rsgrpo/verl/trainer/core_algos.py:
compute_router_outcome_advantage, average_loss mode "router", compute_policy_loss; workers/actor/dp_actor.py
l.286: Σ_k L_k / #{L_k ≠ 0})."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import ObjectiveContext, TokenContext
from trl_groupx.objective.dual_clip import dual_clip_surrogate
from trl_groupx.token_weights import rs_grpo_token_advantages
from trl_groupx.token_weights.rs_grpo import scoped_group_advantages

NAN = float("nan")


def ctx(rewards, blocks, mask, g=4):
    return TokenContext(mask, g, rewards_per_func=rewards, token_blocks=blocks, rewards=rewards.nansum(1))


def test_per_scope_normalisation_hand_derived():
    # column 0: [1, 0, 0, 1] → mean 0.5, Bessel std sqrt(4·0.25/3) = 0.577350 → ±0.5/(0.577350 + 1e-6)
    # column 1: [0.2, 0.2, 0.2, 0.2] → all equal → 0 (0/(0 + 1e-6))
    rewards = torch.tensor([[1.0, 0.2], [0.0, 0.2], [0.0, 0.2], [1.0, 0.2]])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(scoped_group_advantages(rewards, 4),
                               torch.tensor([[a, 0.0], [-a, 0.0], [-a, 0.0], [a, 0.0]]))


def test_scope_average_weights_hand_derived():
    # 4 rollouts × 4 tokens, all real: 16 tokens. Scope 0 = first 3 tokens of every row (12 tokens), scope 1 = last
    # token (4 tokens). Both scopes have non-zero advantages → n_active = 2:
    #   w_0 = 16 / (12 · 2) = 2/3,   w_1 = 16 / (4 · 2) = 2
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    blocks = torch.tensor([[0, 0, 0, 1]] * 4)
    mask = torch.ones(4, 4)
    out = rs_grpo_token_advantages(torch.zeros(4), ctx(rewards, blocks, mask), rs_grpo_scope_average=True)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    sign0, sign1 = torch.tensor([1.0, -1, -1, 1]), torch.tensor([1.0, -1, 1, -1])
    expected = torch.cat([(2 / 3 * a * sign0)[:, None].expand(4, 3), (2 * a * sign1)[:, None]], dim=1)
    torch.testing.assert_close(out, expected)
    plain = rs_grpo_token_advantages(torch.zeros(4), ctx(rewards, blocks, mask), rs_grpo_scope_average=False)
    torch.testing.assert_close(plain, torch.cat([(a * sign0)[:, None].expand(4, 3), (a * sign1)[:, None]], dim=1))


def test_inactive_scope_is_left_out_of_the_average():
    # scope 1's reward is all-equal → zero advantage → n_active = 1: w_0 = 16/12 = 4/3, w_1 = 0
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    blocks = torch.tensor([[0, 0, 0, 1]] * 4)
    out = rs_grpo_token_advantages(torch.zeros(4), ctx(rewards, blocks, torch.ones(4, 4)), rs_grpo_scope_average=True)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(out[:, 0], 4 / 3 * a * torch.tensor([1.0, -1, -1, 1]))
    assert (out[:, 3] == 0).all()


# --- official fixture: the VisRAG loss computed the way its code computes it ---------------------------------------


def official_router_advantages(scores, index, eps=1e-6):
    """compute_router_outcome_advantage: per prompt index and per reward column, (s − mean)/(std + eps), torch.std."""
    out = scores.clone()
    for j in range(scores.shape[1]):
        for idx in index.unique():
            rows = index == idx
            column = scores[rows, j]
            out[rows, j] = (column - column.mean()) / (column.std() + eps)
    return out


def official_scoped_loss(old_logps, logps, advantages, reward_masks, clip_low, clip_high, clip_dual):
    """compute_policy_loss with average_loss(mode="router"), then dp_actor's Σ_k L_k·n_k/n_k^total / #{L_k ≠ 0}
    (one micro-batch = the mini-batch, one process)."""
    adv = advantages.unsqueeze(-1) * reward_masks  # (bs, K, T)
    log_ratio = torch.clamp(logps - old_logps, -20.0, 20.0).unsqueeze(-2).repeat(1, adv.size(1), 1)
    ratio = torch.exp(log_ratio)
    clipped = torch.exp(torch.clamp(log_ratio, math.log(1.0 - clip_low), math.log(1.0 + clip_high)))
    loss_higher = torch.max(-adv * ratio, -adv * clipped)
    loss_lower = torch.min(loss_higher, -adv * clip_dual)
    final = torch.where(adv < 0, loss_lower, loss_higher)
    per_scope = (final * reward_masks).sum(dim=(0, 2)) / (reward_masks.sum(dim=(0, 2)) + 1e-8)
    tokens = reward_masks.sum(dim=(0, 2))
    return (per_scope * tokens / tokens).sum() / (per_scope != 0).sum()


@pytest.mark.parametrize("second_scope_all_equal", [False, True])
def test_matches_the_official_scoped_loss_and_gradient(second_scope_all_equal):
    torch.manual_seed(0)
    n, t, g, k = 8, 7, 4, 2
    rewards = torch.tensor([[1.0, 0.9], [0.0, 0.1], [0.0, 0.6], [1.0, 0.3],
                            [1.0, 0.5], [1.0, 0.8], [0.0, 0.2], [0.0, 0.4]])
    if second_scope_all_equal:
        rewards[:, 1] = 0.5
    lengths = torch.tensor([7, 6, 5, 7, 4, 7, 6, 7])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    # scope 0 on the first 3 tokens, scope 1 on the next 2 (fewer on short rows), the rest outside
    blocks = torch.tensor([0, 0, 0, 1, 1, -1, -1]).repeat(n, 1)
    blocks = torch.where(mask.bool(), blocks, -1)
    old = -torch.rand(n, t) * 2
    logps_ours = (old + 0.3 * torch.randn(n, t)).requires_grad_()
    logps_official = logps_ours.detach().clone().requires_grad_()

    reward_masks = torch.stack([(blocks == j).float() for j in range(k)], dim=1)  # (bs, K, T), disjoint scopes
    adv_official = official_router_advantages(rewards, torch.arange(n) // g)
    loss_official = official_scoped_loss(old, logps_official, adv_official, reward_masks, 0.2, 0.28, 3.0)

    token_adv = rs_grpo_token_advantages(torch.zeros(n), ctx(rewards, blocks, mask), rs_grpo_scope_average=True)
    per_token = dual_clip_surrogate(ObjectiveContext(logps_ours, old, token_adv, mask), epsilon=0.2,
                                    epsilon_high=0.28, dual_clip_c=3.0)
    loss_ours = (per_token * mask).sum() / mask.sum()  # loss_aggregation="global_token_mean"

    torch.testing.assert_close(loss_ours, loss_official)
    loss_ours.backward()
    loss_official.backward()
    torch.testing.assert_close(logps_ours.grad, logps_official.grad)
    assert logps_ours.grad.abs().sum() > 0


def test_edge_cases():
    blocks = torch.tensor([[0, 1, -1]] * 4)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 3: empty completion
    blocks = torch.where(mask.bool(), blocks, -1)
    # all-equal group → 0 everywhere
    same = torch.tensor([[1.0, 0.5]] * 4)
    assert torch.equal(rs_grpo_token_advantages(torch.zeros(4), ctx(same, blocks, mask), rs_grpo_scope_average=True),
                       torch.zeros(4, 3))
    # group size 1 → std undefined → 0
    rewards = torch.tensor([[1.0, 0.5], [0.0, 0.2], [1.0, 0.1], [0.0, 0.9]])
    out = rs_grpo_token_advantages(torch.zeros(4), ctx(rewards, blocks, mask, g=1), rs_grpo_scope_average=True)
    assert torch.equal(out, torch.zeros(4, 3))
    # group size 2: [1, 0] → ±0.5/(sqrt(0.5) + 1e-6)
    adv = scoped_group_advantages(rewards, 2)
    b = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv[:, 0], torch.tensor([b, -b, b, -b]))
    # NaN reward: excluded from its column's statistics, advantage 0 there
    # column 0 = [1, NaN, 0, 0]: mean 1/3, std sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3)
    nan_rewards = torch.tensor([[1.0, 0.5], [NAN, 0.2], [0.0, 0.1], [0.0, 0.9]])
    adv = scoped_group_advantages(nan_rewards, 4)
    s = math.sqrt(1 / 3) + 1e-6
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3 / s, 0.0, -1 / 3 / s, -1 / 3 / s]))
    out = rs_grpo_token_advantages(torch.zeros(4), ctx(nan_rewards, blocks, mask), rs_grpo_scope_average=True)
    assert torch.isfinite(out).all() and out[1, 0] == 0 and out[1, 1] != 0
    # padding and outside tokens stay 0
    assert (out[mask == 0] == 0).all() and (out[:, 2] == 0).all()
    # ±inf is an error
    with pytest.raises(ValueError, match="±inf"):
        rs_grpo_token_advantages(torch.zeros(4), ctx(torch.full((4, 2), math.inf), blocks, mask),
                                 rs_grpo_scope_average=True)


def test_config_validation():
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="rs_grpo",
                  loss_type="dual_clip", loss_aggregation="global_token_mean")
    GRPOConfig(**common)
    with pytest.raises(ValueError, match="rs_grpo_block_tags"):
        GRPOConfig(**common, rs_grpo_block_tags=["answer", "answer"])
    with pytest.raises(ValueError, match="rs_grpo_scope_average=True"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="rs_grpo", loss_type="bnpo")
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="rs_grpo", loss_type="grpo",
               rs_grpo_scope_average=False)
