"""SPO-tree's trainer glue (`token_weighting="spo_segment"`, `spo_segment_mode="tree"`): grow each group's tree from
TRL's rollouts, and the tree's node values for the segment advantages (pure parts: `spo_tree.py`).

Growing (`grow_tree_rollouts`, training batches, right after TRL's generation and scoring): TRL generated `G`
responses per prompt. The depth-0 spines (slots `s` with `s mod m_0 = 0`) keep theirs: each is a sample from the
prompt, so its first `M` tokens are a depth-0 node and the rest of it the first child below at every depth. Then,
depth by depth, every other slot takes its parent node's first `d·M` tokens and a fresh continuation of them (budget
`max_completion_length − d·M`), or copies the parent's response when that node ended it (a leaf). The replaced rows
are re-scored by the run's reward functions; their old and reference log-probs are recomputed. Every process
gathers the completions after each depth and computes the same plan; each generates its own rows in calls of equal
size. Cost: TRL's generation of the `G − b_0` rows that are replaced is spent for nothing (about twice GRPO's
generation in all), measured in `benchmarks/`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from accelerate.utils import gather_object

from ..sampling.dapo_dynamic_sampling import weighted_rewards
from ..sampling.reference_injection import _recompute_logps, _rescore, replace_completions
from .spo_segment import VARIANT_ID
from .spo_segment_rollouts import generate_continuations
from .spo_tree import default_branching, is_internal, node_values, segment_multiplicity, tree_plan

SELECTOR = f"token_weighting={VARIANT_ID!r} with spo_segment_mode='tree'"


def tree_shape(args: Any, num_generations: int) -> tuple[list[int], int]:
    """The run's `(branching, segment length M)`: `spo_segment_tree_branching` (None: `default_branching`) and
    `spo_segment_tree_segment_length` (None: `max_completion_length // D`)."""
    branching = list(args.spo_segment_tree_branching or default_branching(num_generations))
    length = args.spo_segment_tree_segment_length or max(1, args.max_completion_length // len(branching))
    return branching, int(length)


def _response(ids: list[int], eos: set[int]) -> list[int]:
    """A generated response: up to its first EOS (included), else the whole row (TRL pads only finished rows). Read
    from the ids, not the completion mask, which `mask_truncated_completions` zeroes on truncated rows."""
    for k, token in enumerate(ids):
        if token in eos:
            return ids[: k + 1]
    return ids


def _gather_lists(acc: Any, local: list) -> list:
    return gather_object(local) if acc.num_processes > 1 else list(local)


def grow_tree_rollouts(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the local rows of one training generation batch into tree paths (module docstring); updates
    `trainer._rewards_per_func` at the rewritten rows. Returns the local `output`."""
    acc, group = trainer.accelerator, trainer.num_generations
    branching, segment = tree_shape(trainer.args, group)
    depth_count = len(branching)
    local_n = output["completion_ids"].size(0)
    start = acc.process_index * local_n
    local = [_response(output["completion_ids"][i].tolist(), set(trainer.eos_token_ids)) for i in range(local_n)]
    completions = _gather_lists(acc, local)  # global, process order
    if len(completions) % group:
        raise ValueError(f"{SELECTOR}: {len(completions)} rollouts do not split into groups of {group}.")
    plan = [(g * group + s, g * group + p, d) for g in range(len(completions) // group)
            for s, p, d in tree_plan([0] * group, branching, segment)]
    budget_left = trainer.max_completion_length
    filler = output["prompt_ids"][0][output["prompt_mask"][0].bool()].tolist()
    changed, copied = [], 0
    for depth in range(1, depth_count):
        level = [(row, parent) for row, parent, d in plan if d == depth]
        grown = [(row, parent) for row, parent in level
                 if is_internal(len(completions[parent]), depth - 1, segment, depth_count)]
        prefix = depth * segment
        mine = [(row, parent) for row, parent in grown if start <= row < start + local_n]
        queries = [output["prompt_ids"][row - start][output["prompt_mask"][row - start].bool()].tolist()
                   + completions[parent][:prefix] for row, parent in mine]
        budget = max(budget_left - prefix, 1)
        continuations = generate_continuations(trainer, queries, [budget] * len(queries), max(local_n, 1), filler)
        new = _gather_lists(acc, [(row, completions[parent][:prefix] + list(c))
                                  for (row, parent), c in zip(mine, continuations, strict=True)])
        for row, ids in new:
            completions[row] = ids
        for row, parent in level:  # a leaf parent: the slot holds its response
            if (row, parent) not in grown:
                completions[row] = list(completions[parent])
                copied += 1
        changed += [row for row, _ in level]

    rows = sorted(r - start for r in changed if start <= r < start + local_n)
    ids = [completions[start + r] for r in rows]
    output = replace_completions(output, rows, ids, trainer._tokenizer.pad_token_id, selector=SELECTOR)
    if trainer.mask_truncated_completions:  # TRL's rule: a completion without EOS at its end is masked
        ends = [*trainer.eos_token_ids, trainer._tokenizer.pad_token_id]
        for row, seq in zip(rows, ids, strict=True):
            if not seq or seq[-1] not in ends:
                output["completion_mask"][row] = 0
    _recompute_logps(trainer, output, rows)
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    output["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()

    counts = [sum(1 for r in changed if p * local_n <= r < (p + 1) * local_n) for p in range(acc.num_processes)]
    count = max(counts)
    if count:
        scored = _rescore(trainer, inputs, rows, ids, count)  # (P × count, K), process order
        source = torch.tensor([p * count + j for p in range(acc.num_processes) for j in range(counts[p])],
                              dtype=torch.long, device=scored.device)
        targets = sorted(changed)  # each process's rows ascending, processes in order: the order `source` follows
        rewards_per_func = trainer._rewards_per_func.clone()
        rewards_per_func[torch.tensor(targets, dtype=torch.long, device=rewards_per_func.device)] = (
            scored.index_select(0, source).to(rewards_per_func))
        trainer._rewards_per_func = rewards_per_func
    metrics = trainer._metrics["train"]
    metrics["groupx/spo_tree_continued_rows"].append(float(len(changed) - copied))
    metrics["groupx/spo_tree_leaf_copies"].append(float(copied))
    return output


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
