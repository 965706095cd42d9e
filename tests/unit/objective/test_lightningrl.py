"""LightningRL accuracy anchor (`loss_type="lightningrl"`): per-rollout NLL weights that reproduce the official token /
sequence reductions under every supported aggregation, the surrogate's values and gradients, edge cases, config
errors."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, lightningrl_surrogate, nll_anchor_weights
from trl_groupx.objective.lightningrl import ANCHOR_AGGREGATIONS

KW = dict(epsilon=0.2, epsilon_high=0.2)


def weights(rewards, lengths, reduction="token", aggregation="sequence_mean", threshold=1.0, max_len=4):
    return nll_anchor_weights(torch.tensor(rewards), torch.tensor(lengths), threshold=threshold, reduction=reduction,
                              aggregation=aggregation, max_completion_length=max_len)


def test_token_weights_by_hand():
    # rewards (1, 0, 1, NaN), lengths (2, 3, 4, 1): correct = rows 0 and 2, C_tok = 6, N = 4.
    # sequence_mean: a_i = 1/(N |o_i|) → ω_i = N |o_i| / C_tok = (8/6, 0, 16/6, 0)
    torch.testing.assert_close(weights([1.0, 0.0, 1.0, math.nan], [2, 3, 4, 1]), torch.tensor([4 / 3, 0, 8 / 3, 0]))
    # global_token_mean: a_i = 1/N_tok (N_tok = 10) → ω = 10/6 on correct rows
    torch.testing.assert_close(weights([1.0, 0.0, 1.0, math.nan], [2, 3, 4, 1], aggregation="global_token_mean"),
                               torch.tensor([10 / 6, 0, 10 / 6, 0]))


def test_sequence_weights_by_hand():
    # sequence reduction: ω_i = 1 / (|C| |o_i| a_i); sequence_mean → N / |C| = 2 on both correct rows;
    # sequence_sum (a = 1/N) → N / (|C| |o_i|) = (4/4, ·, 4/8)
    torch.testing.assert_close(weights([1.0, 0.0, 1.0, 0.0], [2, 3, 4, 1], "sequence"), torch.tensor([2.0, 0, 2, 0]))
    torch.testing.assert_close(weights([1.0, 0.0, 1.0, 0.0], [2, 3, 4, 1], "sequence", "sequence_sum"),
                               torch.tensor([1.0, 0, 0.5, 0]))


@pytest.mark.parametrize("aggregation", ANCHOR_AGGREGATIONS)
@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_aggregated_term_equals_the_official_reduction(aggregation, reduction):
    """Aggregating ω_i·NLL_it with the trainer's `aggregate` (one micro-batch = the batch) gives the official value."""
    torch.manual_seed(0)
    lengths = torch.tensor([3, 1, 4, 2, 4, 3])
    mask = (torch.arange(4)[None, :] < lengths[:, None]).float()
    nll = torch.rand(6, 4) * 3 * mask
    rewards = torch.tensor([1.0, 0.5, 2.0, 1.0, math.nan, 0.0])  # correct: rows 0, 2, 3 (threshold 1)
    w = nll_anchor_weights(rewards, lengths, threshold=1.0, reduction=reduction, aggregation=aggregation,
                           max_completion_length=4)
    got = aggregate(w[:, None] * nll, mask, aggregation, global_num_tokens=lengths.sum().float(),
                    max_completion_length=4)
    correct = torch.tensor([0, 2, 3])
    if reduction == "token":  # mean over every correct token
        expected = nll[correct].sum() / lengths[correct].sum()
    else:  # mean over correct rollouts of their token mean
        expected = (nll[correct].sum(-1) / lengths[correct]).mean()
    torch.testing.assert_close(got, expected)


def test_edge_cases():
    assert weights([0.0, 0.0], [3, 2]).eq(0).all()  # no correct rollout: no term (the official code skips it)
    assert weights([math.nan, math.nan], [3, 2]).eq(0).all()  # unscored rollouts are not correct
    # a correct rollout with no loss token (fully truncated/masked) is not counted: C_tok = 3 from row 0 only
    torch.testing.assert_close(weights([1.0, 1.0], [3, 0]), torch.tensor([2 * 3 / 3, 0.0]))
    torch.testing.assert_close(weights([1.0, 1.0], [2, 2]), torch.tensor([2 * 2 / 4, 2 * 2 / 4]))  # all correct
    torch.testing.assert_close(weights([0.4, 0.6], [1, 1], threshold=0.5), torch.tensor([0.0, 2.0]))  # threshold
    # group size 1 is refused by the config; a single rollout that is correct gets the whole term
    torch.testing.assert_close(weights([1.0], [5]), torch.tensor([1.0 * 5 / 5]))


def fixture():
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ctx = ObjectiveContext(logps, logps.detach(), torch.tensor([[1.0], [-0.5]]), mask,
                           anchor_weights=torch.tensor([1.5, 0.0]))
    return ctx, logps


def test_on_policy_values_and_gradients_by_hand():
    # on-policy ρ = 1: policy term −A, its gradient −A; NLL term w·ω_i·(−logp), gradient −w·ω_i. w = 0.1, ω = (1.5, 0):
    #   row 0: l = −1 + 0.15·(1.0, 2.0, 0.5) = (−0.85, −0.7, −0.925); grad = −1 − 0.15 = −1.15 on each token
    #   row 1: l = 0.5 (ω = 0: not correct; padding at t=2 gets no NLL); grad = 0.5, 0.5, 0 (masked)
    ctx, logps = fixture()
    loss = lightningrl_surrogate(ctx, **KW, lightningrl_nll_coef=0.1)
    torch.testing.assert_close(loss, torch.tensor([[-0.85, -0.7, -0.925], [0.5, 0.5, 0.5]]))
    (loss * ctx.mask).sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.15, -1.15, -1.15], [0.5, 0.5, 0.0]]))


def test_coefficient_zero_is_the_clipped_surrogate_and_weights_are_required_otherwise():
    ctx, _ = fixture()
    expected = clipped_surrogate(ctx, **KW, delta=None, importance_sampling_level="token")
    torch.testing.assert_close(lightningrl_surrogate(ctx, **KW, lightningrl_nll_coef=0.0), expected)
    ctx.anchor_weights = None
    torch.testing.assert_close(lightningrl_surrogate(ctx, **KW, lightningrl_nll_coef=0.0), expected)
    with pytest.raises(ValueError, match="nll_anchor_weights"):
        lightningrl_surrogate(ctx, **KW, lightningrl_nll_coef=0.1)


def test_padding_is_never_read():
    # row 1's padding position holds an absurd log-prob: the NLL part there is exactly 0; on its real tokens it is
    # w·ω·(−logp) = 0.1·2·(0.7, 1.2)
    ctx, _ = fixture()
    ctx.logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -1e4]])
    ctx.old_logps = ctx.logps.clone()
    ctx.anchor_weights = torch.tensor([1.5, 2.0])
    nll_part = lightningrl_surrogate(ctx, **KW, lightningrl_nll_coef=0.1) - clipped_surrogate(
        ctx, **KW, delta=None, importance_sampling_level="token")
    torch.testing.assert_close(nll_part[1], torch.tensor([0.14, 0.24, 0.0]))


def test_registration_and_defaults():
    v = get_variant("lightningrl")
    assert v.stage == "objective" and v.requires == ("nll_anchor_weights",)
    assert v.flags["lightningrl_nll_coef"] == 0.1 and v.flags["loss_aggregation"] == "sequence_mean"
    assert v.official_code.startswith("SJTU-DENG-Lab/LightningRL@e4d7d293f3d5")


@pytest.mark.parametrize("flags, message", [
    ({"lightningrl_nll_coef": -0.1}, "lightningrl_nll_coef must be a finite number >= 0"),
    ({"lightningrl_nll_coef": math.inf}, "lightningrl_nll_coef must be a finite number >= 0"),
    ({"lightningrl_nll_threshold": math.nan}, "lightningrl_nll_threshold must be a finite number"),
    ({"lightningrl_nll_reduction": "mean"}, "lightningrl_nll_reduction must be one of"),
    ({"loss_aggregation": "token_mean"}, "set loss_aggregation to one of"),
    ({"loss_aggregation": "balanced"}, "set loss_aggregation to one of"),
])
def test_bad_flags_fail_at_construction(tmp_path, flags, message):
    base = dict(get_variant("lightningrl").flags)
    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **{**base, **flags})


def test_hyper_parameters_need_the_loss_type(tmp_path):
    with pytest.raises(ValueError, match="lightningrl_nll_coef"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, lightningrl_nll_coef=0.5)
