"""RLOO leave-one-out advantages on hand-derived numbers, verl's formula and the edge cases."""

import pytest
import torch

from trl_groupx.advantages import group_normalized_advantages, rloo_advantages

NAN, INF = float("nan"), float("inf")


def rloo(r, g):
    return rloo_advantages(torch.tensor(r, dtype=torch.float32), g)


def verl_rloo_reference(scores, group_size):
    """Transcription of verl compute_rloo_outcome_advantage (core_algos.py l.587-636) as a loop over groups:
    score·M/(M−1) − mean·M/(M−1) for M > 1 (the vectorised rloo_vectorized gives 0 for M = 1)."""
    out = scores.clone()
    for start in range(0, len(scores), group_size):
        grp = scores[start:start + group_size]
        m = len(grp)
        out[start:start + group_size] = grp * m / (m - 1) - grp.mean() * m / (m - 1) if m > 1 else 0.0
    return out


def test_hand_values():
    # [1,0,0,0]: 1 − mean(0,0,0) = 1; 0 − mean(1,0,0) = −1/3.  [1,1,0,0]: 1 − 1/3 = 2/3; 0 − 2/3 = −2/3
    torch.testing.assert_close(rloo([1, 0, 0, 0, 1, 1, 0, 0], 4),
                               torch.tensor([1, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3]))


def test_matches_verl_formula_and_is_scaled_dr_grpo():
    torch.manual_seed(0)
    r = torch.rand(40)
    torch.testing.assert_close(rloo_advantages(r, 8), verl_rloo_reference(r, 8))
    # M/(M−1) times the Dr. GRPO (mean-only) advantage
    torch.testing.assert_close(rloo_advantages(r, 8), 8 / 7 * group_normalized_advantages(r, 8, scale_rewards="none"))


def test_all_equal_and_groups_of_one_and_two():
    assert torch.equal(rloo([0.5, 0.5, 0.5, 0.5], 4), torch.zeros(4))
    assert torch.equal(rloo([0.3, 0.9], 1), torch.zeros(2))  # no leave-one-out baseline: 0 (as rloo_vectorized)
    torch.testing.assert_close(rloo([1, 0, 0.25, 0.75], 2), torch.tensor([1.0, -1.0, -0.5, 0.5]))  # r_i − r_other


def test_nan_excluded_and_zero():
    # [1, NaN, 0, 0]: M = 3 → 1 − 0 = 1, 0 − (1+0)/2 = −.5; [NaN, 1, NaN, NaN]: one scored → 0
    a = rloo([1, NAN, 0, 0, NAN, 1, NAN, NAN], 4)
    torch.testing.assert_close(a, torch.tensor([1.0, 0.0, -0.5, -0.5, 0, 0, 0, 0]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='rloo'.*infinite"):
        rloo([1.0, bad], 2)
