"""Trainer glue of `token_weighting="spo_segment"` (SPO-chain): the requirement `segment_mc_values`.

For every completion of this process: its cut points (`spo_segment.cut_points`, from the rollout log-probs), then K
continuations of each distinct `prompt + completion[:j]` from TRL's own generator (`_generate_single_turn`, at the
run's sampling settings), each scored as the response `completion[:j] + continuation` by the run's reward functions
(`sampling._scoring.score_aside`); the value of cut `j` is the mean of its K rewards. Results are gathered so that
every process holds the global `(N, T)` values.

Cross-process: generation runs in calls of exactly `B` sequences (`B` = this process's rows of the generation batch,
TRL's own generate size), the same number of calls on every process (filler sequences where a process has fewer),
each call's `max_new_tokens` the largest budget of that call over all processes; scoring is one call of equal size.
Choice: a continuation's budget is `max_completion_length − j`, so that prefix + continuation is at most a rollout's
length (the official budget is the model context minus the query); generated past its own budget in a shared call,
it is cut there (the same distribution as generating with that budget). Choice: token ids throughout (the official
code decodes the prefix and re-tokenizes the query); identical prefixes of one group are generated once, within a
process (the official code deduplicates identical query texts).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..sampling._scoring import score_aside
from ..sampling.baseline_rollouts import generate_aside, max_new_tokens
from .spo_segment import VARIANT_ID, cut_points

SELECTOR = f"token_weighting={VARIANT_ID!r}"
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes")


def check_spo_segment(trainer: Any) -> None:
    """Construction-time refusal: the continuations come from TRL's single-turn generator."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"{SELECTOR} continues each completion prefix with the trainer's own single-turn generator; "
                         "it cannot reproduce a rollout_func, tools or environments. Drop them, or use another "
                         "token_weighting.")


def _global_max(acc: Any, values: list[int]) -> list[int]:
    """Element-wise maximum over processes of an int list of the same length everywhere."""
    if acc.num_processes == 1 or not values:
        return values
    gathered = acc.gather(torch.tensor(values, device=acc.device, dtype=torch.long)[None]).view(acc.num_processes, -1)
    return gathered.max(dim=0).values.tolist()


def plan_requests(trainer: Any, output: dict[str, Any], logps: torch.Tensor
                  ) -> tuple[list[list[tuple[int, int]]], list[int], list[list[int]], list[list[int]], list[int]]:
    """Distinct requests of this process, sorted by cut (longest budget first): for each, the `(row, j)` cells it
    fills, the row whose dataset inputs score it, the prompt + prefix ids, the prefix ids, and the budget."""
    args = trainer.args
    completion_ids, mask = output["completion_ids"], output["completion_mask"]
    b = completion_ids.size(0)
    group_size = trainer.num_generations
    start = trainer.accelerator.process_index * b
    by_key: dict[tuple[int, tuple[int, ...]], int] = {}
    cells: list[list[tuple[int, int]]] = []
    rows: list[int] = []
    queries: list[list[int]] = []
    prefixes: list[list[int]] = []
    budgets: list[int] = []
    for i in range(b):
        n = int(mask[i].sum().item())
        ids = completion_ids[i, :n].tolist()
        prompt = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
        for j in cut_points(logps[i], n, args.spo_segment_prob_threshold, args.spo_segment_cut_interval,
                            args.spo_segment_max_cut_points):
            key = ((start + i) // group_size, tuple(ids[:j]))
            if key in by_key:
                cells[by_key[key]].append((i, j))
                continue
            by_key[key] = len(cells)
            cells.append([(i, j)])
            rows.append(i)
            queries.append(prompt + ids[:j])
            prefixes.append(ids[:j])
            budgets.append(max(trainer.max_completion_length - j, 1))
    order = sorted(range(len(cells)), key=lambda r: -budgets[r])
    return ([cells[r] for r in order], [rows[r] for r in order], [queries[r] for r in order],
            [prefixes[r] for r in order], [budgets[r] for r in order])


def generate_continuations(trainer: Any, queries: list[list[int]], budgets: list[int], chunk: int,
                           filler: list[int]) -> list[list[int]]:
    """One continuation per query, cut at its budget, in calls of exactly `chunk` sequences, the same number of calls
    on every process (`filler` pads them)."""
    acc = trainer.accelerator
    calls = -(-len(queries) // chunk)
    if acc.num_processes > 1:
        calls = int(acc.gather(torch.tensor([calls], device=acc.device)).max().item())
    call_budgets = [max(budgets[c * chunk : (c + 1) * chunk], default=1) for c in range(calls)]
    call_budgets = _global_max(acc, call_budgets)
    out: list[list[int]] = []
    for c in range(calls):
        batch = queries[c * chunk : (c + 1) * chunk]
        real = len(batch)
        batch = batch + [filler] * (chunk - real)
        with max_new_tokens(trainer, int(call_budgets[c])):
            generated = generate_aside(trainer, batch)
        out.extend(list(g)[: budgets[c * chunk + k]] for k, g in enumerate(generated[:real]))
    return out


def segment_mc_values(trainer: Any, output: dict[str, Any], logps: torch.Tensor | None) -> torch.Tensor:
    """Requirement `segment_mc_values`: global `(N, T)` float32, at each cut token `j` of a completion the mean reward
    of K continuations of `prompt + completion[:j]`, NaN elsewhere (and on every token of evaluation batches);
    identical on every process."""
    acc, args = trainer.accelerator, trainer.args
    if any(output.get(k) is not None for k in _MULTIMODAL_KEYS):
        raise ValueError(f"{SELECTOR} continues text completions only; the batch carries image inputs.")
    completion_ids = output["completion_ids"]
    b, t = completion_ids.shape
    values = torch.full((b, t), math.nan, dtype=torch.float32)
    if trainer.model.training:
        if logps is None:
            raise ValueError(f"{SELECTOR} needs the rollout log-probs (requirement 'old_logps').")
        k = args.spo_segment_num_rollouts
        cells, rows, queries, prefixes, budgets = plan_requests(trainer, output, logps)
        repeated = [q for q in queries for _ in range(k)]
        repeated_budgets = [bud for bud in budgets for _ in range(k)]
        filler = output["prompt_ids"][0][output["prompt_mask"][0].bool()].tolist()
        continuations = generate_continuations(trainer, repeated, repeated_budgets, b, filler)
        # score prefix + continuation as the row's response, one call of equal size on every process
        responses = [prefixes[r // k] + continuations[r] for r in range(len(repeated))]
        score_rows = [trainer._rollout_inputs[rows[r // k]] for r in range(len(repeated))]
        count = len(responses)
        padded_to = int(acc.gather(torch.tensor([count], device=acc.device)).max()) if acc.num_processes > 1 else count
        if padded_to > 0:
            filler_row = trainer._rollout_inputs[0]  # row 0 and its own completion: a scorable response
            filler_ids = completion_ids[0][output["completion_mask"][0].bool()].tolist()
            responses += [filler_ids] * (padded_to - count)
            score_rows += [filler_row] * (padded_to - count)
            per_func = score_aside(trainer, score_rows, responses)  # (P · padded_to, K_funcs)
            weights = trainer.reward_weights.to(per_func.device)
            scored = (per_func * weights).nansum(dim=1)
            scored[torch.isnan(per_func).all(dim=1)] = math.nan
            mine = scored[acc.process_index * padded_to : acc.process_index * padded_to + count].float().cpu()
            per_request = mine.view(-1, k) if count else mine.view(0, k)
            means = torch.nanmean(per_request, dim=1) if count else per_request.sum(1)
            for request, value in zip(cells, means.tolist(), strict=True):
                for row, j in request:
                    values[row, j] = value
        metrics = trainer._metrics["train"]
        real_rows = max(1, int((output["completion_mask"].sum(-1) > 0).sum().item()))
        metrics["groupx/spo_segment_cut_points_per_completion"].append(sum(len(c) for c in cells) / real_rows)
        metrics["groupx/spo_segment_continuations"].append(float(count))
    device = completion_ids.device
    values = acc.pad_across_processes(values.to(device), dim=1, pad_index=math.nan)
    return acc.gather(values)
