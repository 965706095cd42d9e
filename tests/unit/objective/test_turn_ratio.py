"""Turn-level importance ratio (`importance_sampling_level="turn"`, GAGPO's action-level ratio) on hand-derived
tensors: per-turn means, padding and tool tokens never read, the sequence and token ratios as its two limits, the
gradient through every token of a turn, the clip acting per turn, and the config-time checks."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective.dual_clip import dual_clip_surrogate
from trl_groupx.objective.surrogates import clipped_surrogate, log_ratio
from trl_groupx.objective.turn_ratio import completion_turn_ids, turn_level_objectives, turn_log_ratio

NAN, INF = float("nan"), float("inf")


def two_turn_batch():
    """Row 0: turn 0 = tokens 0-1, a tool token, turn 1 = tokens 3-5, padding. Row 1: one turn of 4 tokens, padding.
    `old_logps = 0`, so the token log-ratios are the log-probs; tool and padding positions hold garbage (5, NaN, inf)
    that must never be read."""
    logps = torch.tensor([[0.2, 0.4, 5.0, -0.1, 0.1, 0.3, NAN],
                          [0.1, 0.2, 0.3, 0.6, INF, NAN, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    turn_ids = torch.tensor([[0, 0, -1, 1, 1, 1, -1], [0, 0, 0, 0, -1, -1, -1]])
    return logps, mask, turn_ids


def test_two_turns_of_different_lengths_hand_derived():
    logps, mask, turn_ids = two_turn_batch()
    out = turn_log_ratio(logps - torch.zeros_like(logps), mask, turn_ids)
    # row 0: turn 0 = (0.2 + 0.4) / 2 = 0.3; turn 1 = (-0.1 + 0.1 + 0.3) / 3 = 0.1; tool and padding: 0
    # row 1: (0.1 + 0.2 + 0.3 + 0.6) / 4 = 0.3; padding (inf, NaN) not read: 0
    expected = torch.tensor([[0.3, 0.3, 0.0, 0.1, 0.1, 0.1, 0.0], [0.3, 0.3, 0.3, 0.3, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_gradient_reaches_every_token_of_its_turn_only():
    logps, mask, turn_ids = two_turn_batch()
    ratio = torch.exp(turn_log_ratio(logps, mask, turn_ids))
    # d ρ_a / d logp_t = ρ_a / |a| for t in a: the ratio of turn 1 of row 0 (one of its tokens read) has gradient
    # e^0.1 / 3 on tokens 3, 4, 5 and 0 on turn 0, the tool token and the padding
    (grad,) = torch.autograd.grad(ratio[0, 4], logps, retain_graph=True)
    expected = torch.zeros(2, 7)
    expected[0, 3:6] = math.exp(0.1) / 3
    torch.testing.assert_close(grad, expected)
    # a loss summed over every token (padding included, as the aggregation multiplies by the mask) stays finite
    (grad,) = torch.autograd.grad((ratio * mask).sum(), logps)
    assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()


def test_one_turn_per_row_is_the_sequence_ratio():
    torch.manual_seed(0)
    logps, old = -torch.rand(4, 9), -torch.rand(4, 9)
    mask = (torch.arange(9) < torch.tensor([[9], [5], [1], [7]])).float()
    ctx = ObjectiveContext(logps, old, torch.ones(4, 1), mask, turn_ids=torch.where(mask > 0, 0, -1))
    turn = log_ratio(ctx, "turn")
    sequence = log_ratio(ctx, "sequence").expand_as(turn)
    torch.testing.assert_close(turn[mask > 0], sequence[mask > 0])


def test_one_token_per_turn_is_the_token_ratio():
    torch.manual_seed(1)
    logps, old = -torch.rand(3, 8), -torch.rand(3, 8)
    mask = (torch.rand(3, 8) > 0.3).float()
    turn_ids = torch.where(mask > 0, torch.cumsum(mask, 1).long() - 1, -1)  # every loss token its own turn
    ctx = ObjectiveContext(logps, old, torch.ones(3, 1), mask, turn_ids=turn_ids)
    torch.testing.assert_close(log_ratio(ctx, "turn"), (logps - old) * mask)


def test_loss_token_outside_every_turn_keeps_its_token_ratio():
    lr = torch.tensor([[0.2, 0.4, 0.7]])
    out = turn_log_ratio(lr, torch.ones(1, 3), torch.tensor([[0, 0, -1]]))
    torch.testing.assert_close(out, torch.tensor([[0.3, 0.3, 0.7]]))


def test_the_clip_acts_per_turn():
    logps, mask, turn_ids = two_turn_batch()
    adv = torch.tensor([[1.0, 1, 0, -1, -1, -1, 0], [0.5, 0.5, 0.5, 0.5, 0, 0, 0]])
    ctx = ObjectiveContext(logps, torch.zeros(2, 7), adv, mask, turn_ids=turn_ids)
    loss = clipped_surrogate(ctx, epsilon=0.2, epsilon_high=0.28, delta=None, importance_sampling_level="turn")
    # row 0 turn 0: ρ = e^0.3 = 1.350 > 1.28 with A = 1: clipped, loss -1.28 on both tokens, no gradient;
    # row 0 turn 1: ρ = e^0.1 = 1.105 with A = -1: unclipped, loss e^0.1 on each of its 3 tokens, so each token's
    # gradient is 3 · e^0.1 / 3 = e^0.1; row 1: ρ = e^0.3, A = 0.5: clipped at 1.28, loss -0.64, no gradient
    r1 = math.exp(0.1)
    torch.testing.assert_close(loss[0, [0, 1, 3, 4, 5]], torch.tensor([-1.28, -1.28, r1, r1, r1]))
    torch.testing.assert_close(loss[1, :4], torch.full((4,), -0.64))
    (grad,) = torch.autograd.grad((loss * mask).sum(), logps)
    expected = torch.zeros(2, 7)
    expected[0, 3:6] = r1
    torch.testing.assert_close(grad, expected)
    # token level, token 0 of row 0 (ρ = e^0.2 = 1.221 < 1.28) is not clipped and gets a gradient
    token_ctx = ObjectiveContext(logps.detach().nan_to_num(0.0, 0.0, 0.0).requires_grad_(), torch.zeros(2, 7), adv,
                                 mask)
    token_loss = clipped_surrogate(token_ctx, epsilon=0.2, epsilon_high=0.28, delta=None,
                                   importance_sampling_level="token")
    (token_grad,) = torch.autograd.grad((token_loss * mask).sum(), token_ctx.logps)
    assert token_grad[0, 0] == pytest.approx(-math.exp(0.2))


def test_dual_clip_caps_a_turn_as_a_whole():
    # one turn of two tokens, log-ratios log 4 ± 0.5: the turn ratio is 4 > c = 3 with A = -1, so the loss is capped
    # at -A c = 3 on both tokens, no gradient; at token level the second token's ratio 4 e^-0.5 = 2.43 < 3 is not
    logps = torch.tensor([[math.log(4) + 0.5, math.log(4) - 0.5]], requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(1, 2), torch.tensor([[-1.0]]), torch.ones(1, 2),
                           turn_ids=torch.tensor([[0, 0]]))
    loss = dual_clip_surrogate(ctx, epsilon=0.2, epsilon_high=None, dual_clip_c=3.0, importance_sampling_level="turn")
    torch.testing.assert_close(loss, torch.tensor([[3.0, 3.0]]))
    (grad,) = torch.autograd.grad(loss.sum(), logps)
    assert (grad == 0).all()
    token = dual_clip_surrogate(ctx, epsilon=0.2, epsilon_high=None, dual_clip_c=3.0)
    torch.testing.assert_close(token, torch.tensor([[3.0, 4 * math.exp(-0.5)]]))


def test_missing_or_misshaped_turn_ids_raise():
    lr, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="turn_ids"):
        turn_log_ratio(lr, mask, None)
    with pytest.raises(ValueError, match=r"turn_ids must be \(2, 3\)"):
        turn_log_ratio(lr, mask, torch.zeros(2, 4, dtype=torch.long))


def test_completion_turn_ids_from_the_tool_mask():
    output = {"completion_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 0]]), "tool_mask": torch.tensor([[1, 1, 0, 0, 1, 1, 1]])}
    assert completion_turn_ids(output).tolist() == [[0, 0, -1, -1, 1, 1, -1]]
    del output["tool_mask"]  # no tool mask: the completion is one turn
    assert completion_turn_ids(output).tolist() == [[0, 0, 0, 0, 0, 0, -1]]


BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)


def test_trl_loss_types_refuse_the_turn_level():
    with pytest.raises(ValueError, match=r"importance_sampling_level='turn'.*loss_type='grpo'.*loss_type='dual_clip'"):
        trl_groupx.GRPOConfig(**BASE, loss_type="grpo", importance_sampling_level="turn")
    with pytest.raises(ValueError, match="TRL's loss_type='dapo'"):
        trl_groupx.GRPOConfig(**BASE, loss_type="dapo", importance_sampling_level="turn")


def test_objectives_with_their_own_ratio_refuse_the_turn_level():
    assert {"dual_clip", "offpolicy_grpo"} <= set(turn_level_objectives()) and "gmpo" not in turn_level_objectives()
    with pytest.raises(ValueError, match="loss_type='gmpo' defines its own importance ratio.*dual_clip"):
        trl_groupx.GRPOConfig(**BASE, loss_type="gmpo", importance_sampling_level="turn")
    # "sequence" stays refused for trl_groupx objectives
    with pytest.raises(ValueError, match="defines its own importance ratio"):
        trl_groupx.GRPOConfig(**BASE, loss_type="dual_clip", importance_sampling_level="sequence")


def test_turn_level_is_accepted_where_it_applies():
    assert trl_groupx.GRPOConfig(**BASE, loss_type="dual_clip", importance_sampling_level="turn").loss_type == "dual_clip"
    flags = trl_groupx.get_variant("offpolicy_grpo").flags
    assert trl_groupx.GRPOConfig(**BASE, **{**flags, "importance_sampling_level": "turn"})
    gagpo = trl_groupx.get_variant("gagpo").flags  # GAGPO's paper flags: the action-level ratio in verl's PPO loss
    assert gagpo["importance_sampling_level"] == "turn" and gagpo["loss_type"] == "dual_clip"
    assert trl_groupx.GRPOConfig(**BASE, **gagpo).active_variants() == {"advantages": "gagpo", "objective": "dual_clip"}
