"""SPO-tree's trainer glue (`token_weighting="spo_segment"`, `spo_segment_mode="tree"`): grow each group's tree in the
batch's own generation call, and the tree's node values for the segment advantages (pure parts: `spo_tree.py`).

Growing (`generate_tree`, wrapping TRL's `_generate_single_turn` for a training batch): the depth-0 spines (slots `s`
with `s mod m_0 = 0`) are sampled from the prompt, each a whole response: its first `M` tokens are a depth-0 node
and the rest of it the first child below at every depth. Then, depth by depth, every other slot takes its parent
node's first `d·M` tokens and a fresh continuation of them (budget `max_completion_length − d·M`), or copies the
parent's response when that node ended it (a leaf). TRL then scores, masks and computes the log-probs of every row
as it would of its own rollouts. Every process gathers the completions after each depth and computes the same plan;
each generates its own rows in calls of equal size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from accelerate.utils import gather_object

from ..sampling.dapo_dynamic_sampling import weighted_rewards
from .spo_segment import VARIANT_ID
from .spo_segment_rollouts import _global_max, generate_continuations
from .spo_tree import default_branching, is_internal, node_values, segment_multiplicity, slots_per_node, tree_plan

SELECTOR = f"token_weighting={VARIANT_ID!r} with spo_segment_mode='tree'"


def tree_shape(args: Any, num_generations: int) -> tuple[list[int], int]:
    """The run's `(branching, segment length M)`: `spo_segment_tree_branching` (None: `default_branching`) and
    `spo_segment_tree_segment_length` (None: `max_completion_length // D`)."""
    branching = list(args.spo_segment_tree_branching or default_branching(num_generations))
    length = args.spo_segment_tree_segment_length or max(1, args.max_completion_length // len(branching))
    return branching, int(length)


def _gather_lists(acc: Any, local: list) -> list:
    return gather_object(local) if acc.num_processes > 1 else list(local)


def generate_tree(trainer: Any, generate: Any, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                  num_generations: int, has_tool_images: bool = False) -> tuple[list[list[int]], None]:
    """TRL's `_generate_single_turn` (`generate`) growing a training batch's groups into tree paths (module
    docstring): returns the completions of this process's rows."""
    acc, group = trainer.accelerator, trainer.num_generations
    branching, segment = tree_shape(trainer.args, group)
    depth_count, m0 = len(branching), slots_per_node(branching)[0]
    local_n = len(prompt_ids)
    start = acc.process_index * local_n
    spines = [i for i in range(local_n) if (start + i) % group % m0 == 0]
    calls = _global_max(acc, [len(spines)])[0]  # one call of equal size on every process (filler: prompt 0)
    first, _ = generate([prompt_ids[i] for i in spines] + [prompt_ids[0]] * (calls - len(spines)), images,
                        multimodal_fields, num_generations, has_tool_images)
    local: list[list[int] | None] = [None] * local_n
    for i, ids in zip(spines, first):
        local[i] = list(ids)  # TRL's completions end at their EOS
    completions = _gather_lists(acc, local)  # global, process order
    if len(completions) % group:
        raise ValueError(f"{SELECTOR}: {len(completions)} rollouts do not split into groups of {group}.")
    plan = [(g * group + s, g * group + p, d) for g in range(len(completions) // group)
            for s, p, d in tree_plan(branching)]
    continued = copied = 0
    for depth in range(1, depth_count):
        level = [(row, parent) for row, parent, d in plan if d == depth]
        grown = {(row, parent) for row, parent in level
                 if is_internal(len(completions[parent]), depth - 1, segment, depth_count)}
        prefix = depth * segment
        mine = [(row, parent) for row, parent in level if (row, parent) in grown and start <= row < start + local_n]
        queries = [list(prompt_ids[row - start]) + completions[parent][:prefix] for row, parent in mine]
        budget = max(trainer.max_completion_length - prefix, 1)
        continuations = generate_continuations(trainer, queries, [budget] * len(queries), max(local_n, 1),
                                               list(prompt_ids[0]))
        new = _gather_lists(acc, [(row, completions[parent][:prefix] + list(c))
                                  for (row, parent), c in zip(mine, continuations, strict=True)])
        for row, ids in new:
            completions[row] = ids
        for row, parent in level:  # a leaf parent: the slot holds its response
            if (row, parent) not in grown:
                completions[row] = list(completions[parent])
        continued += len(grown)
        copied += len(level) - len(grown)
    metrics = trainer._metrics["train"]
    metrics["groupx/spo_tree_continued_rows"].append(float(continued))
    metrics["groupx/spo_tree_leaf_copies"].append(float(copied))
    return [completions[start + i] for i in range(local_n)], None


def tree_values(trainer: Any, output: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Requirement `segment_mc_values` in tree mode: global `(N, T)` float32 node values at the segment boundaries
    of each response (`spo_tree.node_values`), NaN elsewhere, and the `(N, T)` multiplicity of each token's edge
    (`spo_tree.segment_multiplicity`); identical on every process. Evaluation batches are not trees: all-NaN values
    (one segment per completion) and no multiplicity."""
    acc = trainer.accelerator
    mask = output["completion_mask"]
    width = mask.size(1)
    if acc.num_processes > 1:
        width = int(acc.gather(torch.tensor([width], device=mask.device)).max())
    lengths = acc.gather(mask.sum(-1))
    if not trainer.model.training:
        return torch.full((lengths.numel(), width), math.nan, dtype=torch.float32, device=mask.device), None
    branching, segment = tree_shape(trainer.args, trainer.num_generations)
    rewards = weighted_rewards(trainer._rewards_per_func, trainer.reward_weights)
    values = node_values(rewards, lengths, branching, segment, width).float().to(mask.device)
    multiplicity = segment_multiplicity(width, branching, segment).float().to(mask.device)
    return values, multiplicity.expand(lengths.numel(), width)
