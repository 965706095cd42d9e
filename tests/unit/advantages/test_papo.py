"""PAPO: outcome z-score over the group + λ · process z-score among correct responses only; derivations in
comments, and the official code's numbers (a loop transcription of tanzelin430/PAPO@277dac1c
verl/verl/trainer/ppo/core_algos.py:compute_grpo_dual_objective_advantage l.395-437)."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages.papo import papo_advantages as papo

NAN = float("nan")
EPS = 1e-6


def official_loop(rule: torch.Tensor, prm: torch.Tensor, group_size: int, lam: float = 1.0) -> torch.Tensor:
    """Per group, as the official loop: A_out = z(rule) if std > eps else 0; A_proc = z(prm | rule == 1) when at
    least two correct and std > eps; A = A_out + lam * A_proc (unbiased torch.std, eps 1e-6)."""
    out = torch.zeros_like(rule)
    for start in range(0, rule.numel(), group_size):
        idx = torch.arange(start, start + group_size)
        r, p = rule[idx], prm[idx]
        a_out = torch.zeros(group_size)
        if group_size > 1 and r.std() > EPS:
            a_out = (r - r.mean()) / (r.std() + EPS)
        a_proc = torch.zeros(group_size)
        correct = r == 1.0
        if correct.sum() >= 2:
            pc = p[correct]
            if pc.std() > EPS:
                a_proc[correct] = (pc - pc.mean()) / (pc.std() + EPS)
        out[idx] = a_out + lam * a_proc
    return out


def test_catalog_check_mixed_group():
    # outcome [1,1,0,0]: mean .5, unbiased std sqrt(1/3) → A_out = ±.5/(sqrt(1/3)+1e-6) = ±0.8660
    # process among correct [.9,.1]: mean .5, std sqrt(.32) → A_proc = ±.4/(sqrt(.32)+1e-6) = ±0.7071 on rows 0, 1
    # incorrect rows get only A_out (their process scores .8/.2 are ignored)
    r = torch.tensor([[1.0, 0.9], [1.0, 0.1], [0.0, 0.8], [0.0, 0.2]])
    o = 0.5 / (math.sqrt(1 / 3) + EPS)
    p = 0.4 / (math.sqrt(0.32) + EPS)
    torch.testing.assert_close(papo(r, 4), torch.tensor([o + p, o - p, -o, -o]))


def test_all_correct_group_keeps_gradient_via_process_and_can_go_negative():
    # official-code.md: all-correct, process [1,.5,.5,0] → [1.22, 0, 0, −1.22] (A_out = 0; std sqrt(1/6))
    r = torch.tensor([[1.0, 1.0], [1.0, 0.5], [1.0, 0.5], [1.0, 0.0]])
    z = 0.5 / (math.sqrt(1 / 6) + EPS)
    torch.testing.assert_close(papo(r, 4), torch.tensor([z, 0.0, 0.0, -z]))
    assert round(z, 2) == 1.22


def test_all_wrong_group_is_zero_whatever_the_process_scores():
    r = torch.tensor([[0.0, 0.9], [0.0, 0.1], [0.0, 0.5], [0.0, 0.0]])
    assert torch.equal(papo(r, 4), torch.zeros(4))


def test_single_correct_response_gets_no_process_term():
    # one correct: fewer than two in the process set → A_proc = 0; A_out on [1,0,0,0]: mean .25, std .5
    r = torch.tensor([[1.0, 0.2], [0.0, 1.0], [0.0, 0.0], [0.0, 0.5]])
    torch.testing.assert_close(papo(r, 4), torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + EPS))


def test_process_weight_and_threshold_and_column_order():
    r = torch.tensor([[1.0, 0.9], [1.0, 0.1], [0.0, 0.8], [0.0, 0.2]])
    o = 0.5 / (math.sqrt(1 / 3) + EPS)
    p = 0.4 / (math.sqrt(0.32) + EPS)
    torch.testing.assert_close(papo(r, 4, papo_process_weight=0.6), torch.tensor([o + .6 * p, o - .6 * p, -o, -o]))
    torch.testing.assert_close(papo(r, 4, papo_process_weight=0.0), torch.tensor([o, o, -o, -o]))
    # swapped columns, a third unrelated column in between
    r3 = torch.stack([r[:, 1], torch.full((4,), 7.0), r[:, 0]], 1)
    torch.testing.assert_close(papo(r3, 4, papo_outcome_reward_index=2, papo_process_reward_index=0), papo(r, 4))
    # a non-binary verifier: correct = outcome ≥ threshold. outcome [.9,.8,0,0] with threshold .5 → rows 0,1 correct
    soft = torch.tensor([[0.9, 0.9], [0.8, 0.1], [0.0, 0.8], [0.0, 0.2]])
    out = papo(soft, 4, papo_correct_threshold=0.5)
    a_out = (soft[:, 0] - soft[:, 0].mean()) / (soft[:, 0].std() + EPS)
    torch.testing.assert_close(out, a_out + torch.tensor([p, -p, 0.0, 0.0]))
    # with the default threshold 1.0 nothing is correct → outcome term only
    torch.testing.assert_close(papo(soft, 4), a_out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_official_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    rule = torch.randint(0, 2, (32,), generator=gen).float()
    prm = torch.randint(0, 3, (32,), generator=gen).float() / 2  # the official judge scores 0 / .5 / 1
    r = torch.stack([rule, prm], 1)
    torch.testing.assert_close(papo(r, 8), official_loop(rule, prm, 8))
    torch.testing.assert_close(papo(r, 4, papo_process_weight=0.6), official_loop(rule, prm, 4, lam=0.6))


def test_nan_outcome_and_nan_process():
    # row 2: outcome NaN → advantage 0 and out of both statistics; row 1: correct but process NaN → keeps A_out,
    # A_proc 0, out of the process statistics. Outcome over rows 0,1,3 = [1,1,0]: mean 2/3, std sqrt(1/3).
    # Process set = {row 0} only (row 1 unscored) → fewer than two → A_proc = 0.
    r = torch.tensor([[1.0, 0.9], [1.0, NAN], [NAN, 0.3], [0.0, 0.2]])
    s = math.sqrt(1 / 3) + EPS
    torch.testing.assert_close(papo(r, 4), torch.tensor([(1 / 3) / s, (1 / 3) / s, 0.0, (-2 / 3) / s]))
    # a row no function scored, and a whole unscored group → 0 and finite
    r2 = torch.tensor([[NAN, NAN], [NAN, NAN], [1.0, 0.4], [0.0, 0.1]])
    out = papo(r2, 2)
    assert torch.isfinite(out).all() and out[:2].eq(0).all()
    # the contract's (N,) input: outcome only (no process term)
    v = torch.tensor([1.0, 0.0, NAN, 1.0])
    out = papo(v, 4)
    assert out[2] == 0 and torch.isfinite(out).all()


def test_group_size_one_and_two():
    r = torch.tensor([[1.0, 0.2], [0.0, 0.9]])
    assert torch.equal(papo(r, 1), torch.zeros(2))  # a single response: no contrast in either statistic
    # G = 2, both correct: A_out 0; process [.2,.9]: mean .55, std .35*sqrt(2) → ±.35/(.35*sqrt(2)+1e-6)
    both = torch.tensor([[1.0, 0.2], [1.0, 0.9]])
    z = 0.35 / (0.35 * math.sqrt(2) + EPS)
    torch.testing.assert_close(papo(both, 2), torch.tensor([-z, z]))
    # G = 2 mixed: A_out ±.5/(sqrt(.5)+1e-6), one correct → no process term
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(papo(r, 2), torch.tensor([a, -a]))


def test_infinite_reward_raises():
    with pytest.raises(ValueError, match="advantage_estimator='papo'.*infinite"):
        papo(torch.tensor([[1.0, float("inf")], [0.0, 0.0]]), 2)


def test_bad_columns_raise_naming_the_flags():
    r = torch.tensor([[1.0], [0.0]])
    with pytest.raises(ValueError, match="at least two reward functions.*papo_outcome_reward_index"):
        papo(r, 2)
    with pytest.raises(ValueError, match="papo_process_reward_index=2 is out of range for 2"):
        papo(torch.zeros(2, 2), 2, papo_process_reward_index=2)
    with pytest.raises(ValueError, match="must differ"):
        papo(torch.zeros(2, 2), 2, papo_process_reward_index=0)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"papo_outcome_reward_index": 1}, "both 1"),
        ({"papo_process_reward_index": -1}, "papo_process_reward_index must be a non-negative integer"),
        ({"papo_outcome_reward_index": 0.5}, "papo_outcome_reward_index must be a non-negative integer"),
        ({"papo_process_weight": -1.0}, "papo_process_weight"),
        ({"papo_process_weight": float("inf")}, "papo_process_weight"),
        ({"papo_correct_threshold": float("nan")}, "papo_correct_threshold"),
    ],
)
def test_config_validation(flags, match):
    with pytest.raises(ValueError, match=match):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, advantage_estimator="papo", **flags)


def test_registered_and_params_need_the_variant():
    v = trl_groupx.get_variant("papo")
    assert v.stage == "advantages" and "rewards_per_func" in v.requires
    assert v.official_code.startswith("tanzelin430/PAPO@277dac1cfe29d465ad9aee0499b4869b698d2e97:")
    config = trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **v.flags)
    assert config.papo_outcome_reward_index == 0 and config.papo_process_reward_index == 1
    with pytest.raises(ValueError):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, papo_process_weight=0.5)
