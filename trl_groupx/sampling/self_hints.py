"""SAGE's trainer glue behind `rollout_filter="sage"` (see `sage.py` for the method and choices).

`check_self_hints` refuses, at trainer construction, what the re-roll cannot reproduce and a dataset without the
reference column; `reroll_with_hints` runs after TRL's generation and scoring: it asks the policy for hints for the
unsolved groups (`write_hints`), re-generates them level by level through TRL's own `_generate_and_score_completions`
and splices the re-rolled groups into the batch (the row merge of `dapo_dynamic_sampling`); `reward_prompts` gives
reward functions the prompt without the hint. SAGE-light (`sage_method="light"`) instead hints prompts before
generation from its per-prompt tracker (`hint_by_level`, the prompt rewriter) and updates the tracker from the
batch's rewards after scoring (`update_hint_levels`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import gather_object

from .baseline_rollouts import _generating_with, generate_aside
from .best_draft import group_first_rows
from .dapo_dynamic_sampling import _log_snapshot, merge_outputs, merge_rows, weighted_rewards
from .sage import (
    HINT_LEVELS,
    LIGHT_STATE_KEY,
    ORIGINAL_PROMPT_COLUMN,
    VARIANT_ID,
    hint_request,
    hinted_prompt,
    level_targets,
    next_hint_level,
    parse_hint_levels,
    prompt_digest,
    reference_text,
    solved_groups,
)


def check_self_hints(trainer: Any) -> None:
    """Trainer-construction refusals (what the config cannot see), naming the flag and the fix."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} writes hints and re-rolls unsolved groups with the trainer's "
                         "own single-turn generator from rewritten prompts; it cannot reproduce a rollout_func, tools "
                         "or environments. Drop them, or unset rollout_filter.")
    column = trainer.args.sage_column
    columns = getattr(trainer.train_dataset, "column_names", None)
    if columns is not None and column not in columns:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} writes its hints from each prompt's reference solution in "
                         f"the dataset column sage_column={column!r}, which train_dataset lacks (columns: "
                         f"{list(columns)}); add the column or set sage_column to the one that holds the solutions.")


def reward_prompts(inputs: list[dict[str, Any]], prompts: list[Any]) -> list[Any]:
    """The prompts reward functions score against: each row's original prompt (`sage_prompt`) where it carries
    one (re-rolled rows, generated from `prompt ⊕ hint`), else the prompt it was generated from."""
    return [row.get(ORIGINAL_PROMPT_COLUMN, prompt) for row, prompt in zip(inputs, prompts, strict=True)]


def write_hints(trainer: Any, inputs: list[dict[str, Any]],
                unsolved: torch.Tensor) -> tuple[list[dict[str, str] | None], int, int]:
    """Hint levels of every global group (None: no hint), identical on every process; plus the number of groups
    whose reply gave no usable hint and of those without a reference. The process holding a group's first row
    writes the hint of each unsolved group it opens (one greedy completion of the hint request); every process
    makes one generation call of the same size (padded with repeats) and the replies are gathered."""
    acc, args, group_size = trainer.accelerator, trainer.args, trainer.num_generations
    local_n, rank = len(inputs), acc.process_index
    start = rank * local_n
    groups, requests, missing = [], [], 0
    for i in group_first_rows(local_n, start, group_size):
        g = (start + i) // group_size
        if not bool(unsolved[g]):
            continue
        solution = reference_text(inputs[i].get(args.sage_column))
        if solution is None:
            missing += 1
            continue
        groups.append(g)
        requests.append(hint_request(inputs[i][ORIGINAL_PROMPT_COLUMN], solution, args.sage_hint_instruction,
                                     args.sage_hint_request_template))
    count = len(requests)
    counts = acc.gather(torch.tensor([count, missing], device=acc.device).view(1, 2)).view(-1, 2)
    padded_to, missing = int(counts[:, 0].max()), int(counts[:, 1].sum())
    hints: list[dict[str, str] | None] = [None] * len(unsolved)
    if padded_to == 0:
        return hints, 0, missing
    filler = requests[0] if requests else hint_request(inputs[0][ORIGINAL_PROMPT_COLUMN], "",
                                                       args.sage_hint_instruction, args.sage_hint_request_template)
    requests = requests + [filler] * (padded_to - count)  # same call size on every process
    prompt_ids, images, multimodal_fields = trainer._tokenize_prompts(copy.deepcopy(requests))
    if images is not None or multimodal_fields:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} supports text prompts only.")
    with _generating_with(trainer, "greedy"):  # an extra completion: the run's base settings, made greedy
        reply_ids = generate_aside(trainer, prompt_ids)
    texts = trainer.processing_class.batch_decode(reply_ids[:count], skip_special_tokens=True)
    replies = list(zip(groups, texts, strict=True))
    replies = gather_object(replies) if acc.num_processes > 1 else replies
    for g, text in replies:
        hints[g] = parse_hint_levels(text)
    return hints, sum(hints[g] is None for g, _ in replies), missing


def hint_by_level(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SAGE-light before generation (`sage_method="light"`; identity for `"sage"`): each group's prompt at its
    tracked next level `>= 1` is generated from `prompt ⊕ hint` (a fresh greedy hint, else the prompt's last parsed
    one). Every process joins one hint-writing call; what it decided is kept for `update_hint_levels`."""
    args, acc = trainer.args, trainer.accelerator
    if args.sage_method != "light":
        return inputs
    group_size, local_n, rank = trainer.num_generations, len(inputs), acc.process_index
    start = rank * local_n
    tracker = trainer.variant_state[LIGHT_STATE_KEY]
    inputs = [{**row, ORIGINAL_PROMPT_COLUMN: row.get(ORIGINAL_PROMPT_COLUMN, row["prompt"])} for row in inputs]
    opened = [((start + i) // group_size, prompt_digest(inputs[i][ORIGINAL_PROMPT_COLUMN]))
              for i in group_first_rows(local_n, start, group_size)]
    keys = dict(gather_object(opened) if acc.num_processes > 1 else opened)  # global group -> prompt key
    num_groups = local_n * acc.num_processes // group_size
    levels = []
    for g in range(num_groups):
        entry = tracker.get(keys[g], {})
        levels.append(next_hint_level(entry.get("level", 0), entry.get("accuracy"), args.sage_light_accuracy_min,
                                      args.sage_light_accuracy_max))
    wanted = torch.tensor([level >= 1 for level in levels])
    hints, failed, missing = write_hints(trainer, inputs, wanted) if bool(wanted.any()) else ([None] * num_groups,
                                                                                               0, 0)
    payloads = [hints[g] or tracker.get(keys[g], {}).get("payload") for g in range(num_groups)]
    applied = [level if level and payloads[g] and payloads[g].get(HINT_LEVELS[level - 1]) else 0
               for g, level in enumerate(levels)]
    trainer._sage_light_visit = (keys, applied, payloads)
    metrics = trainer._metrics["train"]
    metrics["groupx/sage_hint_failed"].append(float(failed))
    metrics["groupx/sage_no_reference"].append(float(missing))
    for level_index in range(1, len(HINT_LEVELS) + 1):
        metrics[f"groupx/sage_hinted_level_{level_index}"].append(
            sum(level == level_index for level in applied) / num_groups)
    rows = []
    for i, row in enumerate(inputs):
        g = (start + i) // group_size
        hint = payloads[g][HINT_LEVELS[applied[g] - 1]] if applied[g] else None
        rows.append({**row, "prompt": hinted_prompt(row[ORIGINAL_PROMPT_COLUMN], hint, args.sage_hint_template)}
                    if hint else row)
    return rows


def update_hint_levels(trainer: Any) -> None:
    """SAGE-light after scoring: each visited prompt's tracker entry becomes the level applied this visit, the
    share of its rollouts scoring above `sage_success_threshold` (NaN counts as unsolved) and its last hint. The
    rewards are gathered, so every process stores the same tracker."""
    keys, applied, payloads = trainer._sage_light_visit
    rewards = weighted_rewards(trainer._rewards_per_func, trainer.reward_weights)
    solved_groups(rewards, trainer.num_generations)  # refuses ±inf rewards
    accuracy = (rewards.view(-1, trainer.num_generations) > trainer.args.sage_success_threshold).float().mean(1)
    tracker = trainer.variant_state[LIGHT_STATE_KEY]
    for g, key in keys.items():
        tracker[key] = {"level": applied[g], "accuracy": float(accuracy[g]), "payload": payloads[g]}
    trainer._sage_light_visit = None


def reroll_with_hints(
    trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any], generate: Callable[[list], dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """SAGE's re-roll of one local training batch: returns `(inputs, output)` with every hinted group's rows taken
    from its last re-roll, and sets `trainer._rewards_per_func` to the merged global reward matrix (process order).
    `generate` is TRL's `_generate_and_score_completions`; every process joins every call."""
    args, acc = trainer.args, trainer.accelerator
    if args.sage_method == "light":  # no re-roll: the prompts were hinted before generation
        update_hint_levels(trainer)
        return inputs, output
    group_size, procs, rank = trainer.num_generations, acc.num_processes, acc.process_index
    local_n = len(inputs)
    n_global, start = local_n * procs, rank * local_n
    inputs = [{**row, ORIGINAL_PROMPT_COLUMN: row.get(ORIGINAL_PROMPT_COLUMN, row["prompt"])} for row in inputs]
    rewards = weighted_rewards(trainer._rewards_per_func, trainer.reward_weights)
    solved = solved_groups(rewards, group_size, args.sage_success_threshold)
    num_groups = solved.numel()
    metrics = trainer._metrics["train"]
    metrics["groupx/sage_unsolved_groups"].append(float((~solved).float().mean().item()))
    hints, failed, missing = ([None] * num_groups, 0, 0) if bool(solved.all()) else write_hints(trainer, inputs,
                                                                                                 ~solved)
    pieces, piece_inputs, piece_rewards = [output], [inputs], [trainer._rewards_per_func]
    log_pieces = [_log_snapshot(trainer._logs, n_global)]
    source, level_of = [0] * num_groups, [0] * num_groups  # per global group: its rows' piece and hint level
    for level_index, level in enumerate(HINT_LEVELS, start=1):
        targets = set(level_targets(solved, hints, level))  # identical on every process
        if not targets:
            continue
        rows = []
        for i, row in enumerate(inputs):
            g = (start + i) // group_size
            hinted = g in targets
            rows.append({**row, "prompt": hinted_prompt(row[ORIGINAL_PROMPT_COLUMN], hints[g][level],
                                                        args.sage_hint_template)} if hinted else row)
        pieces.append(generate(rows))
        piece_inputs.append(rows)
        piece_rewards.append(trainer._rewards_per_func)
        log_pieces.append(_log_snapshot(trainer._logs, n_global))
        rerolled = weighted_rewards(piece_rewards[-1], trainer.reward_weights).view(-1, group_size)
        rewards = rewards.view(-1, group_size).clone()
        for g in targets:
            source[g], level_of[g] = len(pieces) - 1, level_index
            rewards[g] = rerolled[g]
        rewards = rewards.view(-1)
        solved = solved_groups(rewards, group_size, args.sage_success_threshold)

    metrics["groupx/sage_hint_failed"].append(float(failed))
    metrics["groupx/sage_no_reference"].append(float(missing))
    for level_index in range(1, len(HINT_LEVELS) + 1):
        metrics[f"groupx/sage_hinted_level_{level_index}"].append(
            sum(lv == level_index for lv in level_of) / num_groups)
    if len(pieces) == 1:
        return inputs, output

    rows = [(source[(start + i) // group_size], i) for i in range(local_n)]
    merged = merge_outputs(pieces, rows, trainer._tokenizer.pad_token_id)
    loss_mask = merged["completion_mask"] * merged.get("tool_mask", 1)
    merged["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()
    merged_inputs = [piece_inputs[piece][i] for piece, i in rows]
    global_rows = [(source[r // group_size], r) for r in range(n_global)]
    trainer._rewards_per_func = merge_rows(piece_rewards, global_rows, "right", 0.0)
    # Completions table: the rollouts that train (TRL logged each call's rollouts; the deques hold one batch).
    for section, key in log_pieces[-1]:
        values = [snap.get((section, key), []) for snap in log_pieces]
        if any(len(v) != n_global for v in values):
            continue  # not logged for every call (e.g. images); left as TRL wrote it
        deque_ = trainer._logs[key] if section == "top" else trainer._logs[section][key]
        deque_.clear()
        deque_.extend(values[piece][r] for piece, r in global_rows)
    return merged_inputs, merged
