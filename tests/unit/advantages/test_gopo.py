"""GOPO rank-only advantages A = 2 − 4(rank − 1)/(M − 1) on hand-derived numbers, the official formula, edge cases."""

import pytest
import torch

from trl_groupx.advantages import gopo_advantages

NAN, INF = float("nan"), float("inf")


def gopo(r, g):
    return gopo_advantages(torch.tensor(r, dtype=torch.float32), g)


def official_ranking(rewards, group_size):
    """Transcription of the official formula (friendshipkim/gopo@02e2b9f…, grpo_trainer.py l.1327-1330): ranks
    from a double descending argsort, values 2 − 4(rank − 1)/(G − 1). Ties are broken by sort order there."""
    grouped = rewards.view(-1, group_size)
    ranks = torch.argsort(torch.argsort(grouped, dim=1, descending=True), dim=1) + 1
    return (2.0 - 4.0 * (ranks.float() - 1.0) / (group_size - 1)).view(-1)


def test_catalog_check_magnitudes_discarded():
    # G=3: descending ranks of [0.1, 5.0, 0.2] are [3, 1, 2] → [2−4·2/2, 2, 2−4·1/2] = [−2, 2, 0]; same for [1, 3, 2]
    expected = torch.tensor([-2.0, 2.0, 0.0])
    torch.testing.assert_close(gopo([0.1, 5.0, 0.2], 3), expected)
    torch.testing.assert_close(gopo([1, 3, 2], 3), expected)


def test_monotone_transform_invariance_and_official_numbers_without_ties():
    torch.manual_seed(0)
    r = torch.randn(32)  # continuous: no ties
    a = gopo_advantages(r, 8)
    torch.testing.assert_close(a, official_ranking(r, 8))
    torch.testing.assert_close(gopo_advantages(torch.exp(3 * r) + 7, 8), a)
    torch.testing.assert_close(a.view(4, 8).sum(1), torch.zeros(4))


def test_ties_share_averaged_rank():
    # [1, 0, 0, 1]: the two 1s share ranks 1,2 → 1.5 → 2 − 4·0.5/3 = 4/3; the two 0s share 3,4 → 3.5 → −4/3
    torch.testing.assert_close(gopo([1, 0, 0, 1], 4), torch.tensor([4 / 3, -4 / 3, -4 / 3, 4 / 3]))
    # the official arbitrary tie-break would give the tied rollouts different advantages (documented difference)
    off = official_ranking(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4)
    assert off[0] != off[3]


def test_all_equal_group_and_group_sizes_one_and_two():
    assert torch.equal(gopo([0.4, 0.4, 0.4, 0.4], 4), torch.zeros(4))
    assert torch.equal(gopo([0.4, 0.9, 0.1], 1), torch.zeros(3))
    torch.testing.assert_close(gopo([0.2, 0.7, 0.5, 0.5], 2), torch.tensor([-2.0, 2.0, 0.0, 0.0]))


def test_nan_excluded_and_zero():
    # [1, NaN, 0, 0.5]: M = 3 scored, ranks 1, 3, 2 → [2, ·, −2, 0]; [NaN, 3, NaN, NaN]: one scored → 0
    a = gopo([1, NAN, 0, 0.5, NAN, 3, NAN, NAN], 4)
    torch.testing.assert_close(a, torch.tensor([2.0, 0.0, -2.0, 0.0, 0, 0, 0, 0]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='gopo'.*infinite"):
        gopo([1.0, bad], 2)
