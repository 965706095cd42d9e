"""D³S token level, hand-derived. Two groups of G = 2, T = 3, M = 9 real tokens.

| row | A    | mask  | entropies        | score |A|·H       |
|  0  | 1    | 1 1 1 | 0.1 2.0 0.5      | 0.1 2.0 0.5       |
|  1  | −1   | 1 1 0 | 1.0 0.3 (pad)    | 1.0 0.3           |
|  2  | 0.5  | 1 1 1 | 4.0 0.2 1.0      | 2.0 0.1 0.5       |
|  3  | −0.5 | 1 0 0 | 3.0 (pad) (pad)  | 1.5               |
Descending, ties by row-major index: r0t1 2.0, r2t0 2.0, r3t0 1.5, r1t0 1.0, r0t2 .5, r2t2 .5, r1t1 .3, r0t0 .1,
r2t1 .1. ρ = 0.5 (step 0): k = ⌈4.5⌉ = 5 → keep r0t1, r2t0, r3t0, r1t0, r0t2.
"token": c = 9/5 = 1.8; "sequence": c = L_i/k_i = 3/2, 2/1, 3/1, 1/1.
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import d3s_token_advantages
from trl_groupx.token_weights.d3s_token import keep_ratio

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
ENT = torch.tensor([[0.1, 2.0, 0.5], [1.0, 0.3, 1e6], [4.0, 0.2, 1.0], [3.0, 1e6, 1e6]])
A = torch.tensor([1.0, -1.0, 0.5, -0.5])
R = torch.tensor([1.0, 0.0, 1.0, 0.0])
KEPT = torch.tensor([[0, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]], dtype=torch.float)
PARAMS = dict(d3s_token_keep_start=0.5, d3s_token_keep_end=1.0, d3s_token_schedule="linear",
              d3s_token_renormalize="token")


def run(advantages=A, rewards=R, mask=MASK, entropies=ENT, group_size=2, global_step=0, total_steps=10, **overrides):
    ctx = TokenContext(mask, group_size, entropies=entropies, rewards=rewards)
    return d3s_token_advantages(advantages, ctx, **{**PARAMS, **overrides}, global_step=global_step,
                                total_steps=total_steps)


def test_hand_values_and_renormalisation():
    torch.testing.assert_close(run(), 1.8 * A[:, None] * KEPT)
    seq_c = torch.tensor([[1.5], [2.0], [3.0], [1.0]])
    torch.testing.assert_close(run(d3s_token_renormalize="sequence"), seq_c * A[:, None] * KEPT)
    torch.testing.assert_close(run(d3s_token_renormalize="none"), A[:, None] * KEPT)


def test_keeps_exactly_top_rho_and_rho_one_is_grpo():
    out = run(d3s_token_renormalize="none")
    assert int((out != 0).sum()) == 5
    # last step: ρ = 1 → the incoming advantages, exactly
    assert torch.equal(run(global_step=10), A[:, None] * MASK)
    assert torch.equal(run(global_step=50), A[:, None] * MASK)


def test_schedule():
    assert keep_ratio(0.5, 1.0, "linear", 5, 10) == 0.75
    assert math.isclose(keep_ratio(0.5, 1.0, "cosine", 2, 10), 0.5 + 0.5 * (1 - math.cos(0.2 * math.pi)) / 2)
    assert keep_ratio(0.5, 1.0, "constant", 9, 10) == 0.5
    assert keep_ratio(0.5, 1.0, "linear", 7, 0) == 0.5  # unknown total: step 0
    # linear step 2/10: ρ = 0.6 → k = ⌈5.4⌉ = 6 → also r2t2 (0.5); c = 9/6
    kept = KEPT.clone()
    kept[2, 2] = 1
    torch.testing.assert_close(run(global_step=2), 1.5 * A[:, None] * kept)
    # cosine step 2/10: ρ = 0.5477 → k = ⌈4.93⌉ = 5 → same as step 0
    torch.testing.assert_close(run(global_step=2, d3s_token_schedule="cosine"), run())


def test_padding_never_leaks():
    clean = run()
    for junk in (0.0, 1e9, -1e9, float("nan"), float("inf")):
        ent = torch.where(MASK.bool(), ENT, torch.full_like(ENT, junk))
        out = run(entropies=ent)
        torch.testing.assert_close(out, clean)
        assert (out[~MASK.bool()] == 0).all()


def test_all_equal_group_and_group_sizes():
    # group (2,3) all-equal (A = 0): scores 0, ranked last; M = 9, k = 5: r0t1 2.0, r1t0 1.0, r0t2 .5, r1t1 .3,
    # then the first zero-score token r0t0 0.1? no: r0t0 scores 0.1 > 0 → kept 5th; c = 9/5
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])
    expected = 1.8 * torch.tensor([[1.0, 1, 1], [-1, -1, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(run(adv), expected)
    assert torch.equal(run(torch.zeros(4), group_size=1), torch.zeros(4, 3))  # G = 1: A = 0 from TRL
    torch.testing.assert_close(run(group_size=4), run())  # selection is batch-wide; G only shapes A
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_nan_reward():
    rewards, adv = R.clone(), A.clone()
    rewards[3], adv[3] = float("nan"), float("nan")
    # row3 → A 0, score 0; top 5: r0t1, r2t0, r1t0, r0t2, r2t2 → c = 9/5
    expected = 1.8 * torch.tensor([[0, 1.0, 1], [-1, 0, 0], [0.5, 0, 0.5], [0, 0, 0]])
    torch.testing.assert_close(run(adv, rewards), expected)


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="token_weighting='d3s_token'.*inf"):
        run(rewards=torch.tensor([1.0, float("inf"), 0.0, 0.0]))


def test_empty_completion():
    mask = MASK.clone()
    mask[3] = 0  # M = 8, k = 4: r0t1, r2t0, r1t0, r0t2 → c = 2
    expected = 2.0 * torch.tensor([[0, 1.0, 1], [-1, 0, 0], [0.5, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(run(mask=mask), expected)
    assert torch.equal(run(mask=torch.zeros(4, 3, dtype=torch.long)), torch.zeros(4, 3))


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="d3s_token")
    assert GRPOConfig(**base).d3s_token_keep_start == 0.5
    GRPOConfig(**base, loss_type="grpo", d3s_token_renormalize="sequence")
    with pytest.raises(ValueError, match="set d3s_token_renormalize='sequence'"):
        GRPOConfig(**base, loss_type="grpo")
    with pytest.raises(ValueError, match="d3s_token_keep_start"):
        GRPOConfig(**base, d3s_token_keep_start=0.0)
    with pytest.raises(ValueError, match="must be >= d3s_token_keep_start"):
        GRPOConfig(**base, d3s_token_keep_start=0.9, d3s_token_keep_end=0.5)
    with pytest.raises(ValueError, match="d3s_token_schedule"):
        GRPOConfig(**base, d3s_token_schedule="exp")
    with pytest.raises(ValueError, match="d3s_token_renormalize must be one of"):
        GRPOConfig(**base, d3s_token_renormalize="global")
