"""Mu-GRPO negative-advantage veto (trigger = our flag, see the docstring), hand-derived.

N=4, G=2, T=8; log-prob −0.1 everywhere except where marked L = −6 (p ≈ 0.0025 < 0.01); padding holds −50
(p ≈ 0, would trigger if read).

| row | A    | mask     | L at     | expected (inclusive)              |
|  0  | −1   | 8 tokens | t=5, t=7 | −1 on t<5, 0 from the trigger t=5 on |
|  1  | +1   | 8 tokens | all      | +1 everywhere (positive: untouched) |
|  2  | −1   | 4 tokens | (pad)    | −1 on t<4 (padding never triggers)  |
|  3  | −0.5 | 8 tokens | t=0      | all 0 (exclusive: −0.5 at t=0 only) |
"""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import mu_grpo_token_advantages

L = -6.0
MASK = torch.ones(4, 8)
MASK[2, 4:] = 0
LOGPS = torch.full((4, 8), -0.1)
LOGPS[0, 5] = LOGPS[0, 7] = L
LOGPS[1] = L
LOGPS[2, 4:] = -50.0
LOGPS[3, 0] = L
ENT = torch.full((4, 8), 0.5)
ENT[2, 4:] = 1e6  # padding junk
A = torch.tensor([-1.0, 1.0, -1.0, -0.5])
R = torch.tensor([0.0, 1.0, 0.0, 0.5])
PARAMS = dict(mu_grpo_veto_trigger="low_prob", mu_grpo_veto_threshold=0.01, mu_grpo_veto_inclusive=True)


def run(advantages=A, rewards=R, mask=MASK, logps=LOGPS, entropies=ENT, group_size=2, **overrides):
    ctx = TokenContext(mask, group_size, entropies=entropies, logps=logps, rewards=rewards)
    return mu_grpo_token_advantages(advantages, ctx, **{**PARAMS, **overrides})


def test_hand_values_inclusive():
    expected = torch.zeros(4, 8)
    expected[0, :5] = -1
    expected[1] = 1
    expected[2, :4] = -1
    torch.testing.assert_close(run(), expected)


def test_hand_values_exclusive():
    out = run(mu_grpo_veto_inclusive=False)
    torch.testing.assert_close(out[0], torch.tensor([-1.0] * 6 + [0, 0]))  # trigger t=5 kept, suffix t>5 vetoed
    torch.testing.assert_close(out[3], torch.tensor([-0.5] + [0.0] * 7))


def test_high_entropy_trigger():
    ent = ENT.clone()
    ent[0, 2] = 3.0
    ent[1, 0] = 3.0  # positive completion: ignored
    out = run(entropies=ent, mu_grpo_veto_trigger="high_entropy", mu_grpo_veto_threshold=2.0)
    torch.testing.assert_close(out[0], torch.tensor([-1.0, -1.0] + [0.0] * 6))
    torch.testing.assert_close(out[1], torch.ones(8))
    torch.testing.assert_close(out[2], torch.tensor([-1.0] * 4 + [0.0] * 4))  # padding entropy 1e6 never read
    torch.testing.assert_close(out[3], torch.full((8,), -0.5))


def test_no_trigger_is_grpo():
    torch.testing.assert_close(run(logps=torch.full((4, 8), -0.1)), A[:, None] * MASK)


def test_padding_never_leaks():
    for junk in (0.0, -1e4, float("-inf")):
        logps = LOGPS.clone()
        logps[MASK == 0] = junk
        torch.testing.assert_close(run(logps=logps), run())
    assert (run()[MASK == 0] == 0).all()


def test_all_equal_groups_and_group_sizes():
    assert torch.equal(run(torch.zeros(4)), torch.zeros(4, 8))
    assert torch.equal(run(torch.zeros(4), group_size=1), torch.zeros(4, 8))  # G = 1: TRL gives A = 0
    torch.testing.assert_close(run(group_size=4), run())  # per-completion rule: group layout does not matter
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_nan_reward_and_empty_completion():
    rewards, adv = R.clone(), A.clone()
    rewards[0], adv[0] = float("nan"), float("nan")
    out = run(adv, rewards)
    assert (out[0] == 0).all() and torch.isfinite(out).all()
    mask = MASK.clone()
    mask[3] = 0
    assert (run(mask=mask)[3] == 0).all()


def test_inf_reward_is_a_clear_error():
    rewards = R.clone()
    rewards[1] = float("inf")
    with pytest.raises(ValueError, match="token_weighting='mu_grpo'.*inf"):
        run(rewards=rewards)


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="mu_grpo")
    GRPOConfig(**base)
    with pytest.raises(ValueError, match="mu_grpo_veto_trigger must be one of"):
        GRPOConfig(**base, mu_grpo_veto_trigger="ratio")
    with pytest.raises(ValueError, match="is a probability"):
        GRPOConfig(**base, mu_grpo_veto_threshold=2.0)
    GRPOConfig(**base, mu_grpo_veto_trigger="high_entropy", mu_grpo_veto_threshold=2.0)
    with pytest.raises(ValueError, match="loss_type='gmpo' averages token advantages"):
        GRPOConfig(**base, loss_type="gmpo")
    with pytest.raises(ValueError, match="mu_grpo_veto_threshold=0.5 belongs to variant 'mu_grpo'"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, mu_grpo_veto_threshold=0.5)
