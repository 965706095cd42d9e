"""REINFORCE++-baseline (group mean, then batch whitening) on hand-derived numbers, verl's formula, edge cases."""

import math

import pytest
import torch

from trl_groupx.advantages import reinforce_pp_baseline_advantages

NAN, INF = float("nan"), float("inf")


def rpp(r, g):
    return reinforce_pp_baseline_advantages(torch.tensor(r, dtype=torch.float64), g)


def verl_token_level_reference(scores, group_size, length):
    """Transcription of verl compute_reinforce_plus_plus_baseline_outcome_advantage (l.533-584) with masked_whiten
    (torch_functional.py l.311-346) for completions that all have `length` tokens: group mean (0 for a singleton),
    broadcast over tokens, whiten with token mean and Bessel-corrected token variance, eps 1e-8."""
    c = scores.clone()
    for s in range(0, len(scores), group_size):
        grp = scores[s:s + group_size]
        c[s:s + group_size] = grp - (grp.mean() if len(grp) > 1 else 0.0)
    tok = c.unsqueeze(1).repeat(1, length)
    mean = tok.mean()
    var = ((tok - mean) ** 2).mean() * tok.numel() / (tok.numel() - 1)
    return ((tok - mean) * torch.rsqrt(var + 1e-8))[:, 0]


def test_hand_values():
    # centred [.75,−.25,−.25,−.25, .25,.25,.25,−.75]; batch mean 0; unbiased var (2·.5625 + 6·.0625)/7 = 1.5/7
    c = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75], dtype=torch.float64)
    torch.testing.assert_close(rpp([1, 0, 0, 0, 1, 1, 1, 0], 4), c / math.sqrt(1.5 / 7 + 1e-8))


def test_matches_verl_up_to_token_bessel_factor():
    # equal lengths L: same means; verl's Bessel factor counts n·L tokens instead of n rollouts
    torch.manual_seed(0)
    r = torch.rand(24, dtype=torch.float64)
    n, length = 24, 5
    ours = reinforce_pp_baseline_advantages(r, 6)
    verl = verl_token_level_reference(r, 6, length)
    factor = math.sqrt((n * length - 1) / (n * length) * n / (n - 1))
    torch.testing.assert_close(ours, verl / factor, rtol=1e-6, atol=1e-7)


def test_all_equal_groups_and_group_sizes_one_and_two():
    # all groups all-equal → centred 0 everywhere → 0
    assert torch.equal(rpp([1, 1, 0, 0, 0.5, 0.5], 2), torch.zeros(6, dtype=torch.float64))
    # G = 1: baseline 0 (verl), then whitening: [.3, .9] mean .6, var .18 → ±.3/sqrt(.18)
    s = math.sqrt(0.18 + 1e-8)
    torch.testing.assert_close(rpp([0.3, 0.9], 1), torch.tensor([-0.3 / s, 0.3 / s], dtype=torch.float64))
    # G = 2: [1, 0, 1, 1] → centred [.5, −.5, 0, 0]; var (.25+.25)/3 = 1/6
    s = math.sqrt(1 / 6 + 1e-8)
    torch.testing.assert_close(rpp([1, 0, 1, 1], 2), torch.tensor([0.5 / s, -0.5 / s, 0, 0], dtype=torch.float64))


def test_nan_excluded_from_both_statistics():
    # [1, NaN, 0, 0 | 0, 1, NaN, NaN]: group means 1/3 and 1/2 → centred [2/3, −1/3, −1/3 | −.5, .5]
    # batch mean (2/3 − 2/3 + 0)/5 = 0; var (4/9 + 1/9 + 1/9 + .25 + .25)/4
    c = torch.tensor([2 / 3, 0, -1 / 3, -1 / 3, -0.5, 0.5, 0, 0], dtype=torch.float64)
    var = (4 / 9 + 1 / 9 + 1 / 9 + 0.25 + 0.25) / 4
    torch.testing.assert_close(rpp([1, NAN, 0, 0, 0, 1, NAN, NAN], 4), c / math.sqrt(var + 1e-8))


def test_fewer_than_two_scored_gives_zero():
    assert torch.equal(rpp([NAN, 1.0, NAN, NAN], 2), torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='reinforce_pp_baseline'.*infinite"):
        rpp([1.0, bad], 2)
