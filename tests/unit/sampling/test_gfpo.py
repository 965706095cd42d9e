"""GFPO rollout filter on hand-built batches (numbers derived in the comments)."""

import math
from types import SimpleNamespace

import pytest
import torch

from trl_groupx.advantages.group_norm import group_normalized_advantages
from trl_groupx.contracts import RolloutBatch
from trl_groupx.registry import get_variant
from trl_groupx.sampling import apply_keep_mask
from trl_groupx.sampling.gfpo import gfpo_filter

NAN = float("nan")


def batch(rewards, lengths, g):
    return RolloutBatch(torch.tensor(rewards, dtype=torch.float32), torch.tensor(lengths), g)


def kept(mask):
    return mask.nonzero().flatten().tolist()


def test_catalog_check_g8_keeps_exactly_the_k_shortest():
    # G'=8, lengths 5 3 7 3 0 9 2 6 → sorted: 0 (i4), 2 (i6), 3 (i1), 3 (i3), 5 (i0), ...; k=4 → {1, 3, 4, 6}
    b = batch([1.0] * 8, [5, 3, 7, 3, 0, 9, 2, 6], 8)
    keep = gfpo_filter(b, gfpo_keep=4, gfpo_metric="length")
    assert keep.dtype == torch.bool and keep.shape == (8,)
    assert kept(keep) == [1, 3, 4, 6]
    # k=3: the tie at length 3 (i1, i3) is broken towards the lower index → {1, 4, 6}
    assert kept(gfpo_filter(b, gfpo_keep=3, gfpo_metric="length")) == [1, 4, 6]


def test_ties_go_to_the_lower_index_in_the_group():
    # all lengths 3 except i5 (1): k=3 → i5 first, then i0, i1
    b = batch([0.0, 1.0] * 4, [3, 3, 3, 3, 3, 1, 3, 3], 8)
    assert kept(gfpo_filter(b, gfpo_keep=3)) == [0, 1, 5]


def test_vectorised_over_groups():
    # group 0 lengths 4 1 3 2 → k=2 keeps i1, i3; group 1 lengths 1 1 5 0 → keeps i7 (0) then i4 (tie with i5)
    b = batch([1, 0, 1, 0, 1, 0, 1, 0], [4, 1, 3, 2, 1, 1, 5, 0], 4)
    assert kept(gfpo_filter(b, gfpo_keep=2)) == [1, 3, 4, 7]


def test_reward_per_token_keeps_the_most_efficient_and_counts_empty_as_one_token():
    # r/|o|: 1/4=.25, 1/2=.5, 0/1=0, 1/max(0,1)=1 → k=2 keeps i3 (1.0), i1 (.5)
    b = batch([1.0, 1.0, 0.0, 1.0], [4, 2, 1, 0], 4)
    assert kept(gfpo_filter(b, gfpo_keep=2, gfpo_metric="reward_per_token")) == [1, 3]
    # ties in r/|o| (1/2 = 2/4): lower index wins; negative rewards rank below 0
    b = batch([1.0, 2.0, -1.0, 0.0], [2, 4, 1, 3], 4)
    assert kept(gfpo_filter(b, gfpo_keep=1, gfpo_metric="reward_per_token")) == [0]
    assert kept(gfpo_filter(b, gfpo_keep=3, gfpo_metric="reward_per_token")) == [0, 1, 3]


def test_binary_rewards_reward_per_token_keeps_only_correct_answers():
    # official-code note: with 0/1 rewards and >= k correct answers only correct ones are kept → group advantage 0
    b = batch([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], [9, 1, 8, 2, 7, 3], 6)
    keep = gfpo_filter(b, gfpo_keep=3, gfpo_metric="reward_per_token")
    assert kept(keep) == [0, 2, 4]
    adv = group_normalized_advantages(apply_keep_mask(b.rewards, keep), 6)
    assert (adv == 0).all()


@pytest.mark.parametrize("metric", ["length", "reward_per_token"])
def test_nan_rewards_are_never_kept_and_take_no_slot(metric):
    # group 0: i0 unscored (shortest) → k=2 keeps i1, i2 under length (5, 6 < 7);
    # group 1: only i7 scored → keeps just i7 although k=2
    b = batch([NAN, 1.0, 1.0, 1.0, NAN, NAN, NAN, 0.0], [1, 5, 6, 7, 1, 1, 1, 9], 4)
    keep = gfpo_filter(b, gfpo_keep=2, gfpo_metric=metric)
    assert not keep[[0, 4, 5, 6]].any()
    assert keep[7] and keep.view(2, 4).sum(1).tolist() == [2, 1]
    if metric == "length":
        assert kept(keep) == [1, 2, 7]
    else:  # r/|o| = 1/5, 1/6, 1/7 → i1, i2
        assert kept(keep) == [1, 2, 7]


def test_group_size_one_and_two():
    b = batch([1.0, 0.0, NAN], [3, 0, 2], 1)
    assert kept(gfpo_filter(b, gfpo_keep=1)) == [0, 1]  # k >= G: every scored rollout kept
    b = batch([1.0, 0.0, 0.0, 1.0], [4, 2, 2, 2], 2)
    assert kept(gfpo_filter(b, gfpo_keep=1)) == [1, 2]  # shorter of (4, 2); tie (2, 2) → lower index


def test_k_at_least_group_keeps_all_scored():
    b = batch([1.0, NAN, 0.0, 1.0], [1, 2, 3, 4], 4)
    assert kept(gfpo_filter(b, gfpo_keep=8)) == [0, 2, 3]


def test_all_equal_group_is_filtered_and_gets_zero_advantage():
    b = batch([0.5] * 4, [4, 3, 2, 1], 4)
    keep = gfpo_filter(b, gfpo_keep=2)
    assert kept(keep) == [2, 3]
    assert (group_normalized_advantages(apply_keep_mask(b.rewards, keep), 4) == 0).all()


def test_advantage_over_kept_set_vs_paper_population_std():
    # lengths 1 2 3 4, rewards 1 0 1 1, k=2 → keep i0 (r=1), i1 (r=0): mean .5, unbiased std sqrt(.5)
    b = batch([1.0, 0.0, 1.0, 1.0], [1, 2, 3, 4], 4)
    keep = gfpo_filter(b, gfpo_keep=2)
    adv = group_normalized_advantages(apply_keep_mask(b.rewards, keep), 4)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([a, -a, 0.0, 0.0]))
    # paper: population std (0.5) → ±1; ours = paper · sqrt((k-1)/k) up to eps
    assert abs(a - 1.0 * math.sqrt(1 / 2)) < 1e-3


def test_infinite_rewards_raise_naming_the_flag():
    with pytest.raises(ValueError, match="gfpo"):
        gfpo_filter(batch([1.0, float("inf"), 0.0, 0.0], [1, 2, 3, 4], 4), gfpo_keep=2)
    with pytest.raises(ValueError, match="gfpo_metric"):
        gfpo_filter(batch([1.0, 0.0], [1, 2], 2), gfpo_keep=1, gfpo_metric="tokens")


def test_validate():
    validate = get_variant("gfpo").validate
    ok = {"gfpo_metric": "length", "gfpo_keep": 8, "num_generations": 16, "gfpo_adaptive": False,
          "gfpo_adaptive_keep": "8,8,6,4"}
    validate(SimpleNamespace(**ok))
    for bad, match in [({"gfpo_keep": 16}, "smaller than num_generations"), ({"gfpo_keep": 0}, "gfpo_keep"),
                       ({"gfpo_metric": "short"}, "gfpo_metric"),
                       ({"gfpo_adaptive": True, "gfpo_adaptive_keep": "8,8,6"}, "gfpo_adaptive_keep"),
                       ({"gfpo_adaptive": True, "gfpo_adaptive_keep": "16,8,6,4"}, "gfpo_adaptive_keep")]:
        with pytest.raises(ValueError, match=match):
            validate(SimpleNamespace(**{**ok, **bad}))


def test_adaptive_difficulty_k_from_success_rate():
    # lengths 1 2 3 4 in every group → the kept ones are the first k_g; keeps (3, 3, 2, 1) by bucket ⌊4p⌋:
    # p = .25 → bucket 1 → 3; p = 1 → 3 → 1; p = 0 → 0 → 3; p = .75 → 3 → 1; p = .5 → 2 → 2
    rewards = [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 1, 0]
    b = batch(rewards, [1, 2, 3, 4] * 5, 4)
    keep = gfpo_filter(b, gfpo_keep=1, gfpo_adaptive=True, gfpo_adaptive_keep="3,3,2,1")
    assert keep.view(5, 4).sum(1).tolist() == [3, 1, 3, 1, 2]
    assert keep.view(5, 4).tolist() == [[True] * k + [False] * (4 - k) for k in [3, 1, 3, 1, 2]]
    # NaN rewards are left out of the success rate: scored {1, 0} → p = .5 → k = 2
    b = batch([NAN, 1.0, 0.0, NAN], [1, 2, 3, 4], 4)
    assert kept(gfpo_filter(b, gfpo_adaptive=True, gfpo_adaptive_keep="3,3,2,1")) == [1, 2]
    # adaptive off: gfpo_keep applies to every group
    assert gfpo_filter(batch(rewards, [1, 2, 3, 4] * 5, 4), gfpo_keep=1).view(5, 4).sum(1).tolist() == [1] * 5


def test_adaptive_needs_rewards_in_unit_interval():
    with pytest.raises(ValueError, match="gfpo_adaptive"):
        gfpo_filter(batch([2.0, 0.0], [1, 2], 2), gfpo_keep=1, gfpo_adaptive=True, gfpo_adaptive_keep=[1, 1, 1, 1])
