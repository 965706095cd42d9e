"""Pass@k advantage (best rollout gets r_max − r_second) on hand-derived numbers, verl's formula, edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import grpo_passk_advantages

NAN, INF = float("nan"), float("inf")


def pk(r, g, norm=True):
    return grpo_passk_advantages(torch.tensor(r, dtype=torch.float64), g, grpo_passk_norm_by_std=norm)


def verl_passk_reference(scores, group_size, norm=True):
    """Transcription of verl compute_grpo_passk_outcome_advantage (l.471-530): topk 2, margin / (std + 1e-6) on
    the argmax only."""
    out = torch.zeros_like(scores)
    for s in range(0, len(scores), group_size):
        grp = scores[s:s + group_size]
        top, idx = torch.topk(grp, 2)
        adv = top[0] - top[1]
        out[s + idx[0]] = adv / (torch.std(grp) + 1e-6) if norm else adv
    return out


def test_hand_values():
    # [1, 0, .5, .2]: margin 1 − .5 = .5; mean .425, squared deviations sum .5675, unbiased std sqrt(.5675/3)
    std = math.sqrt(0.5675 / 3)
    expected = torch.tensor([0.5 / (std + 1e-6), 0, 0, 0], dtype=torch.float64)
    torch.testing.assert_close(pk([1, 0, 0.5, 0.2], 4), expected)
    torch.testing.assert_close(pk([1, 0, 0.5, 0.2], 4, norm=False), torch.tensor([0.5, 0, 0, 0], dtype=torch.float64))


def test_matches_verl_formula():
    torch.manual_seed(0)
    r = torch.rand(32, dtype=torch.float64)
    for norm in (True, False):
        torch.testing.assert_close(grpo_passk_advantages(r, 8, grpo_passk_norm_by_std=norm),
                                   verl_passk_reference(r, 8, norm))


def test_ties_at_top_and_all_equal_give_zero():
    assert torch.equal(pk([1, 1, 0, 0], 4), torch.zeros(4, dtype=torch.float64))
    assert torch.equal(pk([0.3, 0.3, 0.3, 0.3], 4), torch.zeros(4, dtype=torch.float64))


def test_group_sizes_one_and_two():
    assert torch.equal(pk([1, 0], 1), torch.zeros(2, dtype=torch.float64))  # no runner-up: 0 (verl raises)
    # G = 2 [0, 1]: margin 1, std sqrt(.5) → 1/(sqrt(.5)+1e-6) on the second rollout
    torch.testing.assert_close(pk([0, 1, 1, 1], 2),
                               torch.tensor([0, 1 / (math.sqrt(0.5) + 1e-6), 0, 0], dtype=torch.float64))


def test_nan_excluded_and_zero():
    # [NaN, .2, .7, NaN]: margin .5, std of [.2, .7] = sqrt(.125); [NaN, 1, NaN, NaN]: one scored → 0
    a = pk([NAN, 0.2, 0.7, NAN, NAN, 1, NAN, NAN], 4)
    torch.testing.assert_close(a, torch.tensor([0, 0, 0.5 / (math.sqrt(0.125) + 1e-6), 0, 0, 0, 0, 0],
                                               dtype=torch.float64))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='grpo_passk'.*infinite"):
        pk([1.0, bad], 2)


def test_bad_flag_and_orphan_flag():
    base = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="grpo_passk_norm_by_std must be True or False"):
        GRPOConfig(**base, advantage_estimator="grpo_passk", grpo_passk_norm_by_std="yes")
    with pytest.raises(ValueError, match="grpo_passk_norm_by_std.*not switched on"):
        GRPOConfig(**base, grpo_passk_norm_by_std=False)
