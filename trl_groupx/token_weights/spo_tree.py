"""SPO-tree's pure parts (`token_weighting="spo_segment"`, `spo_segment_mode="tree"`): the tree of a group, its node
values and the segment multiplicities. The trainer glue that grows the tree is `spo_tree_rollouts.py`; the advantage
formula (shared with SPO-chain) is `spo_segment.py`.

A group of `G = b_0 · b_1 ⋯ b_{D−1}` rollouts is the leaf slots of one tree of depth `D` (official
`HybridInferenceStrategy._construct_tree`): the root (the prompt) has `b_0` children, each a segment of `M` tokens
sampled from the prompt; a node at depth `d < D − 1` whose segment did not end the response has `b_{d+1}` children,
segments of `M` tokens sampled after it; the last depth runs to the end of the response. Slot `s` of the group
(`0 ≤ s < G`) belongs, at depth `d`, to node `⌊s / m_d⌋` with `m_d = b_{d+1} ⋯ b_{D−1}` slots per node (`m_{D−1} =
1`). A node that ended the response early is a leaf and all its slots hold its response (official: such a child
gets its reward and is not expanded).

Node values (official `node["reward"] = mean(child rewards)`, leaves their reward): every node's subtree has the
same number of slots per child, so `V(node)` is the mean reward over its slots, and `V(root)` the group's mean.
"""

from __future__ import annotations

import math

import torch


def prime_factors(n: int) -> list[int]:
    """Prime factors of `n ≥ 1`, ascending."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def default_branching(num_generations: int, depth: int = 3) -> list[int]:
    """`depth` branching factors with product `num_generations`, as even as they can be (official trees are 6-6-6
    and 4-5-6 for groups of 216 and 120): the prime factors, largest first, each multiplied into the level with
    the smallest product so far; then sorted in descending order (choice: the official 4-5-6 widens towards the
    leaves; descending puts factors of 1 at the deepest levels, where a node with one child only merges two
    segments, instead of at the root, where a single child would share the root's value and train nothing).
    A prime group gives `[G, 1, …]`: one level of branching."""
    levels = [1] * depth
    for p in sorted(prime_factors(num_generations), reverse=True):
        levels[levels.index(min(levels))] *= p
    return sorted(levels, reverse=True)


def slots_per_node(branching: list[int]) -> list[int]:
    """`m_d = b_{d+1} ⋯ b_{D−1}`: the slots of one node at depth `d` (`m_{D−1} = 1`)."""
    return [math.prod(branching[d + 1:]) for d in range(len(branching))]


def first_depth(slot: int, slots: list[int]) -> int:
    """The shallowest depth at which `slot` is the first slot of its node: from there down, the slot's own
    generation provides the node's segments (its `spine`)."""
    return next(d for d, m in enumerate(slots) if slot % m == 0)


def is_internal(length: int, depth: int, segment_length: int, tree_depth: int) -> bool:
    """Whether the depth-`depth` node of a response of `length` tokens has children: its segment (tokens
    `[d·M, (d+1)·M)`) did not end the response, and it is not at the last depth."""
    return depth < tree_depth - 1 and length > (depth + 1) * segment_length


def tree_plan(branching: list[int]) -> list[tuple[int, int, int]]:
    """What one group's slots do: `(slot, parent slot, depth)` for every slot `s` that is not a depth-0 spine
    (`s mod m_0 ≠ 0`), in the order they can be filled (by depth). `depth = d*` the first depth at which `s` is a
    spine; the parent slot `p = s − s mod m_{d*−1}` owns the depth-`(d* − 1)` node above it. Whether `s` continues
    `p`'s first `d*·M` tokens or copies `p`'s response (the parent node is a leaf) depends on `p`'s length, known
    only once `p` is filled: `spo_tree_rollouts` decides it level by level."""
    slots = slots_per_node(branching)
    plan = []
    for depth in range(1, len(branching)):
        for s in range(math.prod(branching)):
            if first_depth(s, slots) == depth:
                plan.append((s, s - s % slots[depth - 1], depth))
    return plan


def node_values(rewards: torch.Tensor, lengths: torch.Tensor, branching: list[int], segment_length: int,
                width: int) -> torch.Tensor:
    """`(N, width)` float64 values at the cut tokens of a batch of trees, NaN elsewhere: for slot `s` of a group and
    each depth `d < D − 1` whose node is internal for that slot's response, position `j = (d+1)·M` (the first token
    after the node's segment) holds `V(node)`, the NaN-mean reward of the node's slots. `rewards` `(N,)` (NaN =
    unscored), `lengths` `(N,)` the response lengths; `N` a multiple of `G = Π branching`."""
    group = math.prod(branching)
    slots = slots_per_node(branching)
    n = rewards.shape[0]
    if n % group:
        raise ValueError(f"{n} rollouts do not split into trees of {group} (spo_segment_tree_branching={branching}).")
    values = torch.full((n, width), math.nan, dtype=torch.float64)
    r = rewards.detach().double().cpu()
    for depth in range(len(branching) - 1):
        m = slots[depth]
        means = torch.nanmean(r.view(-1, m), dim=1).repeat_interleave(m)  # V(node) for every slot of the node
        j = (depth + 1) * segment_length
        if j >= width:
            break
        internal = lengths.cpu() > j
        values[internal, j] = means[internal]
    return values


def segment_multiplicity(width: int, branching: list[int], segment_length: int) -> torch.Tensor:
    """`(width,)` the number of a group's slots that share the token at each position: a token of the depth-`d`
    segment (`d = min(⌊t / M⌋, D − 1)`) lies on the edge into a depth-`d` node, shared by its `m_d` slots."""
    slots = torch.tensor(slots_per_node(branching), dtype=torch.float64)
    depth = (torch.arange(width) // segment_length).clamp(max=len(branching) - 1)
    return slots[depth]
