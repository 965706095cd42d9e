"""Zero-variance group filter on hand-built batches."""

import pytest
import torch

from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.zero_variance_filter import zero_variance_filter

NAN = float("nan")


def f(rewards, g, lengths=None):
    r = torch.tensor(rewards, dtype=torch.float32)
    lengths = torch.tensor(lengths) if lengths is not None else torch.ones_like(r, dtype=torch.long)
    return zero_variance_filter(RolloutBatch(r, lengths, g)).tolist()


def test_drops_all_equal_groups_keeps_mixed_ones():
    # group 0 all 1 (dropped), group 1 mixed (kept), group 2 all 0 (dropped), group 3 all 0.5 (dropped)
    r = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5]
    assert f(r, 4) == [False] * 4 + [True] * 4 + [False] * 8


def test_exact_equality_no_tolerance():
    assert f([0.3, 0.3 + 1e-7], 2) == [True, True]


def test_nan_rewards_are_ignored_for_the_test_and_dropped():
    # group 0: scored {1, 0} differ → kept except the NaN; group 1: scored {1, 1} equal → dropped;
    # group 2: one scored → dropped; group 3: all NaN → dropped
    r = [1, NAN, 0, NAN, 1, NAN, 1, NAN, NAN, 0, NAN, NAN, NAN, NAN, NAN, NAN]
    assert f(r, 4) == [True, False, True, False] + [False] * 12


def test_group_size_one_and_two():
    assert f([1.0, 0.0, NAN], 1) == [True, True, False]  # G=1: verl keeps single-trajectory groups
    assert f([1.0, 0.0, 1.0, 1.0, 0.0, NAN], 2) == [True, True, False, False, False, False]


def test_lengths_are_irrelevant_including_empty_completions():
    assert f([1.0, 0.0, 1.0, 1.0], 2, lengths=[0, 0, 5, 0]) == [True, True, False, False]


def test_infinite_rewards_raise_naming_the_flag():
    with pytest.raises(ValueError, match="zero_variance_filter"):
        f([1.0, float("inf")], 2)
