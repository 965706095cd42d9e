"""DaGRPO's pair masking on hand-built similarity matrices and rewards: which rows are masked, their numbers, the
edge cases, the toy scorer and the configuration errors."""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages.dagrpo import (
    dagrpo_advantages,
    indistinct_rows,
    register_dagrpo_scorer,
    token_jaccard_similarity,
)
from trl_groupx.advantages.group_norm import group_normalized_advantages

NAN = float("nan")


def _sim(*pairs, g=4, value=1.0):
    """One (1, G, G) matrix: identity plus `value` on the symmetric `pairs`, 0 elsewhere."""
    sim = torch.eye(g)
    for i, j in pairs:
        sim[i, j] = sim[j, i] = value
    return sim[None]


def test_identical_pair_with_opposite_advantages_is_masked():
    # rewards [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> A = ±0.5/(0.57735+1e-4) = ±0.86588.
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv, keep = dagrpo_advantages(rewards, 4, pair_similarity=_sim((0, 1)))
    a = 0.5 / (3 ** -0.5 + 1e-4)
    # rows 0 (A>0) and 1 (A<0) are identical -> both masked; rows 2, 3 keep GRPO's advantages.
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, a, -a]))
    assert keep.tolist() == [False, False, True, True]


def test_identical_pair_with_same_sign_is_not_masked():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv, keep = dagrpo_advantages(rewards, 4, pair_similarity=_sim((0, 2)))  # both A > 0: no conflict
    torch.testing.assert_close(adv, group_normalized_advantages(rewards, 4))
    assert keep.all()


def test_distinct_pair_is_not_masked_and_threshold_is_inclusive():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv, keep = dagrpo_advantages(rewards, 4, pair_similarity=_sim((0, 1), value=0.89))
    assert keep.all() and torch.equal(adv, group_normalized_advantages(rewards, 4))
    _, keep = dagrpo_advantages(rewards, 4, pair_similarity=_sim((0, 1), value=0.9), dagrpo_similarity_threshold=0.9)
    assert keep.tolist() == [False, False, True, True]


def test_hand_built_matrix_two_groups():
    # group 0: rewards [3, 1, 2, 2] -> mean 2, std sqrt(2/3) = 0.81650; A = [1.22459, -1.22459, 0, 0].
    #   sim(0,1) = 0.95 (opposite, masked); sim(0,2) = 1 but A_2 = 0 (no conflict).
    # group 1: rewards [1, 0, 0, 0] -> mean 0.25, std 0.5; A = [1.49970, -0.49990 x3].
    #   sim(1,2) = 1 (same sign, kept); sim(0,3) = 0.92 (opposite, masked).
    rewards = torch.tensor([3.0, 1.0, 2.0, 2.0, 1.0, 0.0, 0.0, 0.0])
    sim = torch.cat([_sim((0, 1), value=0.95), _sim((1, 2))])
    sim[0, 0, 2] = sim[0, 2, 0] = 1.0
    sim[1, 0, 3] = sim[1, 3, 0] = 0.92
    adv, keep = dagrpo_advantages(rewards, 4, pair_similarity=sim)
    c = -0.25 / (0.5 + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, c, c, 0.0]))
    assert keep.tolist() == [False, False, True, True, False, True, True, False]


def test_indistinct_rows_ignores_diagonal_and_nan_similarity():
    a = torch.tensor([1.0, -1.0, 0.5, -0.5])
    sim = torch.full((1, 4, 4), NAN)
    assert not indistinct_rows(a, sim, 4, 0.9).any()
    sim = torch.ones(1, 4, 4)  # diagonal 1 too: a row never pairs with itself
    assert indistinct_rows(a, sim, 4, 0.9).all()


def test_all_equal_group_has_nothing_to_mask():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])
    adv, keep = dagrpo_advantages(rewards, 4, pair_similarity=torch.ones(1, 4, 4))
    assert torch.equal(adv, torch.zeros(4)) and keep.all()


def test_group_size_two():
    # [1, 0]: A = ±0.5/(0.70711+1e-4) = ±0.70701; identical -> both masked.
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    sim = torch.stack([torch.ones(2, 2), torch.eye(2)])  # group 0 identical, group 1 distinct
    adv, keep = dagrpo_advantages(rewards, 2, pair_similarity=sim)
    a = 0.5 / (0.5 ** 0.5 + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, a, -a]))
    assert keep.tolist() == [False, False, True, True]


def test_group_size_one_raises():
    with pytest.raises(ValueError, match="num_generations >= 2"):
        dagrpo_advantages(torch.tensor([1.0, 0.0]), 1)


def test_nan_reward_row_gets_zero_and_is_never_masked():
    # rewards [1, nan, 0, 0]: scored [1, 0, 0] -> mean 1/3, std 0.57735; A = [1.15450, 0, -0.57725, -0.57725].
    rewards = torch.tensor([1.0, NAN, 0.0, 0.0])
    adv, keep = dagrpo_advantages(rewards, 4, pair_similarity=_sim((0, 1), (1, 2)))
    base = group_normalized_advantages(rewards, 4)
    assert base[1] == 0
    torch.testing.assert_close(adv, base)  # the NaN row's A = 0 conflicts with nothing
    assert keep.all()


def test_inf_reward_and_out_of_range_similarity_raise():
    with pytest.raises(ValueError, match="inf"):
        dagrpo_advantages(torch.tensor([float("inf"), 0.0]), 2)
    with pytest.raises(ValueError, match="dagrpo_scorer.*\\[0, 1\\]"):
        dagrpo_advantages(torch.tensor([1.0, 0.0]), 2, pair_similarity=torch.tensor([[[1.0, 1.5], [1.5, 1.0]]]))


def test_without_similarity_is_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    adv, keep = dagrpo_advantages(rewards, 4)
    assert torch.equal(adv, group_normalized_advantages(rewards, 4)) and keep.all()


def test_token_jaccard_scorer():
    # {1,2,3} vs {2,3,4}: 2 shared of 4 -> 0.5; identical -> 1; two empty -> 1; empty vs {1,2,3} -> 0.
    sim = token_jaccard_similarity(["a", "b", "c", "", ""], [[1, 2, 3], [2, 3, 4], [3, 2, 1, 1], [], []])
    assert sim[0][1] == 0.5 and sim[0][2] == 1.0 and sim[3][4] == 1.0 and sim[0][3] == 0.0


def _config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="dagrpo", **flags)


def test_config_errors():
    with pytest.raises(ValueError, match="dagrpo_scorer is not set"):
        _config()
    with pytest.raises(ValueError, match="dagrpo_scorer='nope' is not registered.*register_dagrpo_scorer"):
        _config(dagrpo_scorer="nope")
    for bad in (0.0, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="dagrpo_similarity_threshold must lie in \\(0, 1\\]"):
            _config(dagrpo_scorer="token_jaccard", dagrpo_similarity_threshold=bad)
    register_dagrpo_scorer("unit_test_scorer", token_jaccard_similarity)
    assert _config(dagrpo_scorer="unit_test_scorer").dagrpo_similarity_threshold == 0.9
    with pytest.raises(ValueError, match="dagrpo_similarity_threshold=0.5 belongs to variant .dagrpo."):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, dagrpo_similarity_threshold=0.5)
