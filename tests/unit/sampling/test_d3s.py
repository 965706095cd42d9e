"""D³S sample-level filter on hand-built batches (numbers derived in the comments)."""

from types import SimpleNamespace

import pytest
import torch

from trl_groupx.advantages.group_norm import group_normalized_advantages
from trl_groupx.contracts import RolloutBatch
from trl_groupx.registry import get_variant
from trl_groupx.sampling import apply_keep_mask
from trl_groupx.sampling.d3s import d3s_filter, d3s_keep_ratio, max_variance_subset

NAN = float("nan")


def b(rewards, g):
    r = torch.tensor(rewards, dtype=torch.float32)
    return RolloutBatch(r, torch.ones_like(r, dtype=torch.long), g)


def kept(mask):
    return mask.nonzero().flatten().tolist()


def test_catalog_check_binary_keep_4_takes_2_pos_2_neg():
    # [1,1,1,0,0,0,0,0], k=4: j positives + (4-j) negatives has variance p(1-p), p=j/4 → max at j=2
    keep = max_variance_subset(torch.tensor([1.0, 1, 1, 0, 0, 0, 0, 0]), 8, 4)
    assert keep.sum() == 4 and keep[:3].sum() == 2 and keep[3:].sum() == 2
    # ties among equal rewards: the top part takes the higher indices (1, 2), the bottom the lower (3, 4)
    assert kept(keep) == [1, 2, 3, 4]


def test_real_rewards_pick_the_extremes():
    # [0,1,2,3,4,10,5,6], k=3. Candidates (top j + bottom 3-j): j=0 {0,1,2} var .667; j=1 {0,1,10} mean 11/3,
    # var (13.44+7.11+40.11)/3 = 20.2; j=2 {0,6,10} mean 16/3, var (28.44+.44+21.78)/3 = 16.9; j=3 {5,6,10} 4.67
    assert kept(max_variance_subset(torch.tensor([0.0, 1, 2, 3, 4, 10, 5, 6]), 8, 3)) == [0, 1, 5]
    # brute force over all 3-subsets agrees on random groups (vectorised over 5 groups)
    import itertools

    torch.manual_seed(0)
    r = torch.randn(5, 7)
    keep = max_variance_subset(r.flatten(), 7, 3).view(5, 7)
    for g in range(5):
        best = max(itertools.combinations(range(7), 3), key=lambda c: r[g, list(c)].var().item())
        assert r[g, keep[g]].var().item() == pytest.approx(r[g, list(best)].var().item(), rel=1e-6)


def test_all_equal_group_keeps_k_with_zero_advantage():
    keep = max_variance_subset(torch.tensor([1.0, 1, 1, 1]), 4, 2)
    # every split has variance 0; the balanced split j=1 is taken: bottom → index 0, top → index 3
    assert kept(keep) == [0, 3]
    assert (group_normalized_advantages(apply_keep_mask(torch.ones(4), keep), 4) == 0).all()


def test_nan_rewards_never_kept_and_take_no_slot():
    # group 0: scored {1: 1, 2: 0}, k=3 → only 2 scored → keep both; group 1: all unscored → keep none
    keep = max_variance_subset(torch.tensor([NAN, 1.0, 0.0, NAN, NAN, NAN, NAN, NAN]), 4, 3)
    assert kept(keep) == [1, 2]


def test_group_size_one_and_two():
    assert kept(d3s_filter(b([1.0, 0.0, NAN], 1), d3s_keep_start=0.5)) == [0, 1]  # k = min(G, 2) = 1
    assert kept(d3s_filter(b([1.0, 0.0, 0.0, 0.0], 2), d3s_keep_start=0.5)) == [0, 1, 2, 3]  # k = 2 = G


def test_schedule_aggressive_early_relaxed_late():
    assert d3s_keep_ratio(0, 100, 0.5, 1.0) == 0.5
    assert d3s_keep_ratio(50, 100, 0.5, 1.0) == 0.75
    assert d3s_keep_ratio(200, 100, 0.5, 1.0) == 1.0
    assert d3s_keep_ratio(7, 0, 0.5, 1.0) == 0.5  # unknown horizon: step 0
    r = [1.0, 1, 1, 0, 0, 0, 0, 0]
    # step 0: k = round(.5·8) = 4; step 50/100: k = 6 (j=3: 3 pos + 3 neg); end: k = 8 = GRPO (all kept)
    assert d3s_filter(b(r, 8), global_step=0, total_steps=100).sum() == 4
    keep = d3s_filter(b(r, 8), global_step=50, total_steps=100)
    assert keep[:3].all() and keep[3:].sum() == 3
    assert d3s_filter(b(r, 8), global_step=100, total_steps=100).all()


def test_kept_advantages_are_renormalised_over_the_subset():
    # k=2 of [3, 1, 2, 0]: the max-variance pair is {3, 0} → mean 1.5, unbiased std 3/sqrt(2)
    r = torch.tensor([3.0, 1.0, 2.0, 0.0])
    keep = d3s_filter(RolloutBatch(r, torch.ones(4), 4), d3s_keep_start=0.5, d3s_keep_end=0.5)
    assert kept(keep) == [0, 3]
    a = 1.5 / (3 / 2**0.5 + 1e-4)
    torch.testing.assert_close(group_normalized_advantages(apply_keep_mask(r, keep), 4), torch.tensor([a, 0, 0, -a]))


def test_infinite_rewards_raise_naming_the_flag():
    with pytest.raises(ValueError, match="d3s"):
        d3s_filter(b([1.0, float("-inf"), 0.0, 0.0], 4))


def test_validate():
    validate = get_variant("d3s").validate
    validate(SimpleNamespace(d3s_keep_start=0.5, d3s_keep_end=1.0))
    for bad, match in [({"d3s_keep_start": 0.0}, "d3s_keep_start"), ({"d3s_keep_end": 1.5}, "d3s_keep_end"),
                       ({"d3s_keep_start": 0.8, "d3s_keep_end": 0.6}, "relaxes")]:
        with pytest.raises(ValueError, match=match):
            validate(SimpleNamespace(**{"d3s_keep_start": 0.5, "d3s_keep_end": 1.0, **bad}))
