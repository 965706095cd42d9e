"""Advantage Reweighting (lopti), hand-derived: A' = (α·p + 1 − α)·A, α = 0.3 → weight 0.3·p + 0.7.

| row | A    | mask  | p (real tokens)  | weights             | A'                     |
|  0  | 1    | 1 1 1 | 1, 0.5, 0.1      | 1.0, 0.85, 0.73     | 1.0, 0.85, 0.73        |
|  1  | −1   | 1 1 0 | 0.5, 1, (pad)    | 0.85, 1.0           | −0.85, −1.0, 0         |
|  2  | 0.5  | 1 0 0 | 0.1, (pad)       | 0.73                | 0.365, 0, 0            |
|  3  | −0.5 | 0 0 0 | (empty)          | –                   | 0, 0, 0                |
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import lopti_token_advantages

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
P = torch.tensor([[1.0, 0.5, 0.1], [0.5, 1.0, 1.0], [0.1, 1.0, 1.0], [1.0, 1.0, 1.0]])
LOGPS = P.log()
A = torch.tensor([1.0, -1.0, 0.5, -0.5])
R = torch.tensor([1.0, 0.0, 1.0, 0.0])
EXPECTED = torch.tensor([[1.0, 0.85, 0.73], [-0.85, -1.0, 0.0], [0.365, 0.0, 0.0], [0.0, 0.0, 0.0]])


def run(advantages=A, rewards=R, mask=MASK, logps=LOGPS, group_size=4, lopti_alpha=0.3):
    ctx = TokenContext(mask, group_size, logps=logps, rewards=rewards)
    return lopti_token_advantages(advantages, ctx, lopti_alpha=lopti_alpha)


def test_hand_values():
    torch.testing.assert_close(run(), EXPECTED)


def test_alpha_extremes_and_catalog_check():
    torch.testing.assert_close(run(lopti_alpha=0.0), A[:, None] * MASK)  # α = 0 → GRPO
    torch.testing.assert_close(run(lopti_alpha=1.0), A[:, None] * P * MASK)  # α = 1 → A·p
    # catalog: a p = 0.9 token weighs more than a p = 0.1 token (0.97 vs 0.73)
    out = run(torch.ones(4), logps=torch.tensor([[0.9, 0.1, 1.0]] * 4).log())
    assert out[0, 0] > out[0, 1] and math.isclose(out[0, 0].item(), 0.97, rel_tol=1e-6)


def test_padding_never_leaks():
    for junk in (float("nan"), float("inf"), float("-inf"), 50.0):
        logps = torch.where(MASK.bool(), LOGPS, torch.full_like(LOGPS, junk))
        out = run(logps=logps)
        torch.testing.assert_close(out, EXPECTED)
        assert (out[~MASK.bool()] == 0).all()


def test_all_equal_group_and_group_sizes():
    assert torch.equal(run(torch.zeros(4)), torch.zeros(4, 3))
    assert torch.equal(run(torch.zeros(4), group_size=1), torch.zeros(4, 3))  # G = 1: A = 0 from TRL
    torch.testing.assert_close(run(group_size=2), EXPECTED)  # per-token weight: group size plays no role
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_nan_reward_and_advantage_give_zero():
    rewards, adv = R.clone(), A.clone()
    rewards[0], adv[1] = float("nan"), float("nan")
    out = run(adv, rewards)
    assert (out[:2] == 0).all()
    torch.testing.assert_close(out[2:], EXPECTED[2:])


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="token_weighting='lopti'.*inf"):
        run(rewards=torch.tensor([1.0, float("-inf"), 0.0, 0.0]))


def test_empty_completion_and_token_level_input():
    assert (run()[3] == 0).all()
    assert torch.equal(run(mask=torch.zeros(4, 3, dtype=torch.long)), torch.zeros(4, 3))
    torch.testing.assert_close(run(A[:, None].expand(4, 3).clone()), EXPECTED)


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="lopti")
    assert GRPOConfig(**base).lopti_alpha == 0.3
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="lopti_alpha"):
            GRPOConfig(**base, lopti_alpha=bad)
