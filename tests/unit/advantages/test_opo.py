"""OPO length-weighted baseline on hand-derived numbers, verl's loop formula and the edge cases."""

import pytest
import torch

from trl_groupx import get_variant
from trl_groupx.advantages import opo_advantages

NAN, INF = float("nan"), float("inf")


def opo(r, g, lengths):
    return opo_advantages(torch.tensor(r, dtype=torch.float32), g,
                          completion_lengths=torch.tensor(lengths, dtype=torch.float32))


def verl_opo_reference(scores, lengths, group_size):
    """Transcription of verl compute_opo_outcome_advantage (core_algos.py l.639-690) as a loop over prompt groups:
    bsl = Σ L·r / Σ L for a group of more than one rollout, 0 for a group of one; A = r − bsl."""
    out = scores.clone()
    for start in range(0, len(scores), group_size):
        s, ln = scores[start:start + group_size], lengths[start:start + group_size]
        bsl = (ln * s).sum() / ln.sum() if len(s) > 1 else torch.tensor(0.0)
        out[start:start + group_size] = s - bsl
    return out


def test_registered_with_trainer_supplied_lengths():
    v = get_variant("opo")
    assert v.stage == "advantages" and v.requires == ("completion_lengths",) and v.flags == {
        "advantage_estimator": "opo"}


def test_hand_values():
    # group 1: r = [1, 0, 0, 1], L = [1, 2, 3, 4]: b = (1·1 + 4·1)/10 = 0.5 → A = [.5, −.5, −.5, .5]
    # group 2: r = [1, 0, 0, 0], L = [6, 2, 1, 1]: b = 6/10 = 0.6 → A = [.4, −.6, −.6, −.6]
    a = opo([1, 0, 0, 1, 1, 0, 0, 0], 4, [1, 2, 3, 4, 6, 2, 1, 1])
    torch.testing.assert_close(a, torch.tensor([.5, -.5, -.5, .5, .4, -.6, -.6, -.6]))


def test_equal_lengths_give_mean_baseline_and_length_weighting_matters():
    # equal lengths: b = plain group mean (Dr. GRPO advantage)
    torch.testing.assert_close(opo([1, 0, 0, 0], 4, [5, 5, 5, 5]), torch.tensor([.75, -.25, -.25, -.25]))
    # the long correct answer pulls the baseline up: L = [7, 1, 1, 1] → b = .7
    torch.testing.assert_close(opo([1, 0, 0, 0], 4, [7, 1, 1, 1]), torch.tensor([.3, -.7, -.7, -.7]))


def test_matches_verl_formula():
    torch.manual_seed(0)
    r, lengths = torch.rand(40), torch.randint(1, 50, (40,)).float()
    torch.testing.assert_close(opo_advantages(r, 8, completion_lengths=lengths), verl_opo_reference(r, lengths, 8))
    torch.testing.assert_close(opo_advantages(r, 1, completion_lengths=lengths), verl_opo_reference(r, lengths, 1))


def test_all_equal_and_groups_of_one_and_two():
    assert torch.equal(opo([0.5, 0.5, 0.5, 0.5], 4, [1, 9, 3, 2]), torch.zeros(4))
    # G = 1: verl's baseline is 0, so A = r (l.677-678)
    torch.testing.assert_close(opo([0.3, 0.9], 1, [4, 7]), torch.tensor([0.3, 0.9]))
    # G = 2: r = [1, 0], L = [1, 3]: b = 1/4 → [.75, −.25]
    torch.testing.assert_close(opo([1, 0], 2, [1, 3]), torch.tensor([0.75, -0.25]))


def test_nan_rewards_excluded_and_zero():
    # [1, NaN, 0, 0], L = [2, 100, 1, 1]: the NaN rollout's length is not counted: b = 2/4 = .5
    a = opo([1, NAN, 0, 0, NAN, NAN, NAN, NAN], 4, [2, 100, 1, 1, 3, 3, 3, 3])
    torch.testing.assert_close(a, torch.tensor([.5, 0, -.5, -.5, 0, 0, 0, 0]))
    torch.testing.assert_close(opo([NAN, 0.4], 1, [3, 3]), torch.tensor([0.0, 0.4]))
    assert torch.isfinite(a).all()


def test_empty_completions_excluded_from_baseline():
    # r = [1, 1, 0, 0], L = [0, 2, 1, 1]: the empty rollout has weight 0: b = 2/4 = .5; it keeps r − b = .5
    torch.testing.assert_close(opo([1, 1, 0, 0], 4, [0, 2, 1, 1]), torch.tensor([.5, .5, -.5, -.5]))
    # all empty: no baseline, all 0 (verl would give 0/0)
    assert torch.equal(opo([1, 0, 1, 0], 4, [0, 0, 0, 0]), torch.zeros(4))


def test_truncated_lengths_are_just_lengths():
    # a truncated completion counts with its (capped) length: r = [0, 1], L = [8 (cap), 2] → b = .2
    torch.testing.assert_close(opo([0, 1], 2, [8, 2]), torch.tensor([-.2, .8]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='opo'.*infinite"):
        opo([1.0, bad], 2, [1, 1])


def test_bad_lengths():
    with pytest.raises(ValueError, match="opo"):
        opo([1.0, 0.0], 2, [1, -1])
    with pytest.raises(ValueError, match="completion_lengths"):
        opo([1.0, 0.0], 2, [1, 1, 1])
