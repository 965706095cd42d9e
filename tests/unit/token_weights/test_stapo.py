"""STAPO spurious-token masking, hand-derived (τ_p = 0.002 → log τ_p = −6.2146; q = 0.75).

One group of G=4, A = [1, 1, −1, −1]; "L" = log-prob −7 (p ≈ 0.0009 < τ_p), "h" = −1 (p ≈ 0.37).

| row | A  | mask    | logp        | entropy            |
|  0  | +1 | 1 1 1 1 | L h L L     | 0.1 0.5 0.3 0.9    |
|  1  | +1 | 1 1 1 0 | L L h (pad) | 0.2 0.6 0.05 (pad) |
|  2  | −1 | 1 1 1 1 | L L L L     | 0.01 each          |   negative: never masked
|  3  | −1 | 1 1 0 0 | L L (pad)   | 0.01 0.01          |

Candidates (A>0, p<τ_p, real token): r0t0 0.1, r0t2 0.3, r0t3 0.9, r1t0 0.2, r1t1 0.6.
Quantile 0.75 of [0.1, 0.2, 0.3, 0.6, 0.9] (linear): index 4·0.75 = 3 → τ_H = 0.6.
Spurious (H < 0.6): r0t0, r1t0, r0t2 → 3 of 13 real tokens; 10 valid.
If the padding (logp −50, entropy 0) leaked into the candidates, the quantile would become 0.825 and r1t1 would be
masked too.
Renormalisation: "token" c = 13/10 = 1.3; "sequence" c_0 = 4/2, c_1 = 3/2, c_2 = c_3 = 1.
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import stapo_token_advantages

L, H_, PAD = -7.0, -1.0, -50.0
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
LOGPS = torch.tensor([[L, H_, L, L], [L, L, H_, PAD], [L, L, L, L], [L, L, PAD, PAD]])
ENT = torch.tensor([[0.1, 0.5, 0.3, 0.9], [0.2, 0.6, 0.05, 0.0], [0.01] * 4, [0.01, 0.01, 0.0, 0.0]])
A = torch.tensor([1.0, 1.0, -1.0, -1.0])
R = torch.tensor([1.0, 1.0, 0.0, 0.0])
PARAMS = dict(stapo_prob_threshold=0.002, stapo_entropy_quantile=0.75, stapo_renormalize="token")


def run(advantages=A, rewards=R, mask=MASK, logps=LOGPS, entropies=ENT, group_size=4, **overrides):
    ctx = TokenContext(mask, group_size, entropies=entropies, logps=logps, rewards=rewards)
    return stapo_token_advantages(advantages, ctx, **{**PARAMS, **overrides})


def test_hand_values_token_renormalisation():
    c = 13 / 10
    expected = torch.tensor([[0, c, 0, c], [0, c, c, 0], [-c] * 4, [-c, -c, 0, 0]])
    torch.testing.assert_close(run(), expected)


def test_hand_values_sequence_and_none():
    expected = torch.tensor([[0, 2, 0, 2], [0, 1.5, 1.5, 0], [-1.0] * 4, [-1, -1, 0, 0]])
    torch.testing.assert_close(run(stapo_renormalize="sequence"), expected)
    expected = torch.tensor([[0, 1.0, 0, 1], [0, 1, 1, 0], [-1.0] * 4, [-1, -1, 0, 0]])
    torch.testing.assert_close(run(stapo_renormalize="none"), expected)


def test_token_mode_equals_masked_mean_over_valid_tokens():
    # DAPO-style loss at ratio 1: Σ −A'·m / Σ m  must equal  Σ_valid −A / #valid
    out = run()
    valid = torch.tensor([[0, 1, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    dapo = -(out * MASK).sum() / MASK.sum()
    renormalised = -(A[:, None].expand(4, 4)[valid]).sum() / valid.sum()
    torch.testing.assert_close(dapo, renormalised)


def test_padding_never_leaks():
    for junk_logp, junk_ent in ((-1e4, -5.0), (0.0, 1e6), (float("-inf"), 0.0)):
        logps, ent = LOGPS.clone(), ENT.clone()
        logps[~MASK.bool()], ent[~MASK.bool()] = junk_logp, junk_ent
        out = run(logps=logps, entropies=ent)
        torch.testing.assert_close(out, run())
        assert (out[~MASK.bool()] == 0).all() and torch.isfinite(out).all()


def test_quantile_extremes_and_no_candidates():
    # q = 0: τ_H = min → strict "<" masks nothing; output = A on real tokens
    torch.testing.assert_close(run(stapo_entropy_quantile=0.0), A[:, None] * MASK)
    # q = 1: τ_H = 0.9 → every candidate but r0t3 masked (4 spurious, c = 13/9)
    out = run(stapo_entropy_quantile=1.0)
    c = 13 / 9
    torch.testing.assert_close(out[:2], torch.tensor([[0, c, 0, c], [0, 0, c, 0]]))
    # no low-probability token at all
    torch.testing.assert_close(run(logps=torch.full((4, 4), -0.1)), A[:, None] * MASK)


def test_all_equal_group_and_group_sizes():
    assert torch.equal(run(torch.zeros(4)), torch.zeros(4, 4))
    assert torch.equal(run(torch.zeros(4), group_size=1), torch.zeros(4, 4))  # G = 1: TRL gives A = 0
    torch.testing.assert_close(run(group_size=2), run())  # G = 2: groups (0,1), (2,3); numbers unchanged
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_nan_reward_rows_get_zero_and_are_no_candidates():
    rewards = R.clone()
    rewards[1] = float("nan")
    adv = A.clone()
    adv[1] = float("nan")
    out = run(adv, rewards)
    assert (out[1] == 0).all()
    # candidates now r0t0 .1, r0t2 .3, r0t3 .9 → τ_H = quantile .75 = 0.6 → r0t0, r0t2 masked;
    # 2 of 13 → c = 13/11
    c = 13 / 11
    torch.testing.assert_close(out[0], torch.tensor([0, c, 0, c]))
    torch.testing.assert_close(out[2], torch.full((4,), -c))


def test_inf_reward_is_a_clear_error():
    rewards = R.clone()
    rewards[0] = float("-inf")
    with pytest.raises(ValueError, match="token_weighting='stapo'.*inf"):
        run(rewards=rewards)


def test_empty_completion():
    mask = MASK.clone()
    mask[1] = 0  # row 1 empty: its tokens are not candidates; candidates .1 .3 .9 → τ_H 0.6 → 2 masked of 10
    out = run(mask=mask)
    assert (out[1] == 0).all()
    c = 10 / 8
    torch.testing.assert_close(out[0], torch.tensor([0, c, 0, c]))


def test_token_level_input_advantages():
    # an earlier token stage may hand (N, T) advantages: positivity is per token
    adv = A[:, None].expand(4, 4).clone()
    torch.testing.assert_close(run(adv), run())


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="stapo")
    GRPOConfig(**base)  # dapo (global token mean) + "token"
    GRPOConfig(**base, loss_type="grpo", stapo_renormalize="sequence")
    with pytest.raises(ValueError, match="set stapo_renormalize='sequence'"):
        GRPOConfig(**base, loss_type="grpo")
    with pytest.raises(ValueError, match="stapo_prob_threshold"):
        GRPOConfig(**base, stapo_prob_threshold=0.0)
    with pytest.raises(ValueError, match="stapo_entropy_quantile"):
        GRPOConfig(**base, stapo_entropy_quantile=1.5)
    with pytest.raises(ValueError, match="stapo_renormalize must be one of"):
        GRPOConfig(**base, stapo_renormalize="global")
    with pytest.raises(ValueError, match="loss_type='gmpo' averages token advantages"):
        GRPOConfig(**base, loss_type="gmpo", stapo_renormalize="sequence")
    assert math.isclose(GRPOConfig(**base).stapo_prob_threshold, 0.002)


def test_quantile_matches_torch_quantile():
    from trl_groupx.token_weights.stapo import _quantile

    values = torch.rand(37, generator=torch.Generator().manual_seed(3))
    for q in (0.0, 0.1, 0.5, 0.75, 0.999, 1.0):
        torch.testing.assert_close(_quantile(values, q), torch.quantile(values, q))
