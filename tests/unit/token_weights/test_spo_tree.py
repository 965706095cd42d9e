"""SPO-tree (`token_weighting="spo_segment"`, `spo_segment_mode="tree"`): the default branching, the slot plan, node
values, segment multiplicities and the tree-mode advantages on hand-built trees; config errors."""

import dataclasses
import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights.spo_segment import spo_segment_token_advantages
from trl_groupx.token_weights.spo_tree import (
    default_branching,
    first_depth,
    is_internal,
    node_values,
    segment_multiplicity,
    slots_per_node,
    tree_plan,
)

NAN = float("nan")


def test_default_branching_splits_the_group_evenly_over_three_depths():
    assert default_branching(216) == [6, 6, 6]  # the official tree
    assert default_branching(120) == [6, 5, 4]  # official 4-5-6, widest first here
    assert default_branching(8) == [2, 2, 2] and default_branching(16) == [4, 2, 2]
    assert default_branching(4) == [2, 2, 1] and default_branching(12) == [3, 2, 2]
    assert default_branching(7) == [7, 1, 1] and default_branching(2) == [2, 1, 1]
    assert default_branching(1) == [1, 1, 1] and default_branching(36, depth=2) == [6, 6]


def test_slots_first_depths_and_plan_of_a_2_2_2_tree():
    assert slots_per_node([2, 2, 2]) == [4, 2, 1] and slots_per_node([3, 2]) == [2, 1]
    assert [first_depth(s, [4, 2, 1]) for s in range(8)] == [0, 2, 1, 2, 0, 2, 1, 2]
    # depth 1: slots 2 and 6 continue the depth-0 spines 0 and 4; depth 2: each odd slot continues the even one
    assert tree_plan([2, 2, 2]) == [(2, 0, 1), (6, 4, 1), (1, 0, 2), (3, 2, 2), (5, 4, 2), (7, 6, 2)]
    assert tree_plan([4]) == []  # depth 1: every slot is sampled from the prompt (plain GRPO)


def test_a_node_is_internal_when_its_segment_did_not_end_the_response():
    # M = 3, depth 3: the depth-0 segment is tokens 0..2, depth 1 is 3..5, depth 2 the rest
    assert is_internal(4, 0, 3, 3) and not is_internal(3, 0, 3, 3)  # ended exactly at the boundary: a leaf
    assert is_internal(7, 1, 3, 3) and not is_internal(6, 1, 3, 3)
    assert not is_internal(100, 2, 3, 3)  # the last depth never branches


def test_node_values_are_the_mean_reward_of_their_slots():
    # one 2-2-2 group, M = 2, width 8. Rewards by slot; lengths: slot 4's depth-0 node ended early (its whole
    # subtree copies it: lengths 2), slot 2's depth-1 node ended at 4 tokens (slots 2, 3)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    lengths = torch.tensor([6, 5, 4, 4, 2, 2, 2, 2])
    values = node_values(rewards, lengths, [2, 2, 2], 2, 8)
    # depth-0 nodes {0..3} → 0.75, {4..7} → 0; at position 2 for responses longer than 2 tokens
    # depth-1 nodes {0,1} → 0.5, {2,3} → 1.0; at position 4 for responses longer than 4 tokens
    expected = torch.full((8, 8), NAN, dtype=torch.float64)
    expected[0, 2] = expected[1, 2] = expected[2, 2] = expected[3, 2] = 0.75
    expected[0, 4] = expected[1, 4] = 0.5
    assert torch.equal(values.isnan(), expected.isnan())
    assert torch.equal(values.nan_to_num(-1), expected.nan_to_num(-1))
    # unscored slots are left out of a node's mean; a node of unscored slots only has no value
    values = node_values(torch.tensor([NAN, 1.0, NAN, NAN]), torch.tensor([5, 5, 5, 5]), [2, 2], 2, 6)
    assert values[0, 2] == values[1, 2] == 1.0 and values[2:, 2].isnan().all()
    with pytest.raises(ValueError, match="do not split into trees of 8"):
        node_values(torch.zeros(4), torch.ones(4), [2, 2, 2], 2, 8)


def test_segment_multiplicity_counts_the_rows_that_share_a_token():
    # 2-2-2, M = 2: tokens 0-1 lie on a depth-0 edge (4 rows), 2-3 on a depth-1 edge (2 rows), the rest 1 row
    assert segment_multiplicity(7, [2, 2, 2], 2).tolist() == [4, 4, 2, 2, 1, 1, 1]


def test_tree_advantages_hand_computed():
    # one 2-2 group (G = 4), M = 2; every token sampled with p = 0.5 < τ (all trained)
    # rewards 1, 0 | 1, 1; responses of 3 tokens: depth-0 node values .5 and 1 at position 2; V(root) = .75
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.ones(4, 3)
    values = node_values(rewards, torch.tensor([3, 3, 3, 3]), [2, 2], 2, 3).float()
    multiplicity = segment_multiplicity(3, [2, 2], 2).float().expand(4, 3)
    ctx = TokenContext(completion_mask=mask, group_size=4, logps=torch.full((4, 3), math.log(0.5)),
                       rewards=rewards, segment_mc_values=values, segment_multiplicity=multiplicity)
    out = spo_segment_token_advantages(torch.zeros(4), ctx, spo_segment_prob_threshold=0.9)
    # raw: depth-0 tokens (0, 1): V(node) − V(root) = −.25, −.25, .25, .25; depth-1 token 2: R − V(node) =
    # .5, −.5, 0, 0. The two zero-advantage leaf edges (rows 2, 3) are dropped. The distinct edge tokens left: two
    # depth-0 segments of 2 tokens (−.25, .25) and two leaf tokens (.5, −.5): mean 0, unbiased var =
    # (4·.0625 + 2·.25) / 5 = 3/20 (the rows' duplicates weigh 1/2)
    scale = 1 / math.sqrt(3 / 20 + 1e-8)
    raw = torch.tensor([[-.25, -.25, .5], [-.25, -.25, -.5], [.25, .25, 0.0], [.25, .25, 0.0]], dtype=torch.float64)
    multiplicity = torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64)
    assert torch.allclose(out.double(), raw * scale / multiplicity, atol=1e-6)
    assert (out[2:, 2] == 0).all()
    # a tree whose edges all keep the value (an all-equal group) trains nothing
    flat = dataclasses.replace(ctx, rewards=torch.ones(4), segment_mc_values=node_values(
        torch.ones(4), torch.tensor([3, 3, 3, 3]), [2, 2], 2, 3).float())
    assert (spo_segment_token_advantages(torch.zeros(4), flat, spo_segment_prob_threshold=0.9) == 0).all()
    # the chain mode (and an evaluation batch: no multiplicity) whitens over every row's tokens and does not divide:
    # var = (8·.0625 + 2·.25) / 11 = 1/11
    chain = spo_segment_token_advantages(torch.zeros(4), dataclasses.replace(ctx, segment_multiplicity=None),
                                         spo_segment_prob_threshold=0.9)
    assert torch.allclose(chain.double(), raw / math.sqrt(1 / 11 + 1e-8), atol=1e-6)


@pytest.mark.parametrize(("flags", "match"), [
    (dict(spo_segment_mode="forest"), "spo_segment_mode='forest'"),
    (dict(spo_segment_mode="tree", spo_segment_tree_branching=[2, 3]), r"product 6, but.*num_generations=4"),
    (dict(spo_segment_mode="tree", spo_segment_tree_branching=[2, 0, 2]), r"spo_segment_tree_branching=\[2, 0, 2\]"),
    (dict(spo_segment_mode="tree", spo_segment_tree_segment_length=0), "spo_segment_tree_segment_length=0"),
    (dict(spo_segment_mode="tree", spo_segment_tree_segment_length=8), r"8 × 2 branching depths ≥ max_completion"),
    (dict(spo_segment_mode="tree", rollout_filter="dapo_dynamic_sampling"),
     "rollout_filter='dapo_dynamic_sampling' also rewrites"),
])
def test_bad_tree_flags_name_the_fix(tmp_path, flags, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, token_weighting="spo_segment", num_generations=4,
                   per_device_train_batch_size=4, max_completion_length=16, **flags)
