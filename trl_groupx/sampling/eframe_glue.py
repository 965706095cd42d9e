"""EFRame's trainer glue: filter the on-policy rows, generate and append the exploration rows of all-fail prompts,
store high-advantage rows in the replay buffer and append a replay when due.

Called at the end of `GRPOTrainer._generate_and_score_completions` (training only), after the advantage stages, on
the same seam as RePO (`trl_groupx/sampling/replay.py`: rows appended to every per-row tensor, dealt out evenly over
processes in a multiple of `steps_per_generation`, `num_items_in_batch` recounted). The formulas and choices are
documented on `trl_groupx.sampling.eframe.eframe`.

Consistency across processes: the hard prompts, the extra rewards, the selected rows and the buffer are decided on
gathered tensors, so every process holds the same buffer; every process makes exactly one extra generate call with
the same number of prompts (its share of the hard prompts, padded with a repeat), or none when no prompt is hard.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

import torch

from ..advantages.group_norm import group_normalized_advantages
from ._scoring import score_aside
from .eframe import (
    VARIANT_ID,
    add_to_buffer,
    all_fail_groups,
    buffer_size,
    replay_due,
    replay_indices,
    select_abs_above,
)
from .replay import SUPPORTED_KEYS, _append
from .repo import weighted_rewards

Row = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float]  # prompt ids, completion ids, logps, advantage


def eframe_step(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """Filter, explore, store and replay (see the module docstring); returns `output` with this process's share of
    the appended rows."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} generates the extra rollouts with the trainer's own "
                         "single-turn generator; it cannot reproduce a rollout_func, tools or environments. Drop them.")
    unknown = set(output) - SUPPORTED_KEYS
    if unknown:
        raise NotImplementedError(
            f"rollout_filter={VARIANT_ID!r} cannot append rows to a batch with {sorted(unknown)} (tool masks, "
            "multimodal inputs, vLLM sampling ratios and per-row tensors of other trl_groupx stages are not "
            "supported); use it with a text-only single-turn setup."
        )
    if output["advantages"].dim() != 1:
        raise NotImplementedError(f"rollout_filter={VARIANT_ID!r} selects rows by a per-rollout advantage; it does "
                                  "not compose with per-token advantages of a token_weighting stage.")
    args, acc = trainer.args, trainer.accelerator
    state = trainer.variant_state[VARIANT_ID]
    state["batches"] = int(state.get("batches", 0)) + 1
    pad_id = trainer._tokenizer.pad_token_id
    metrics = trainer._metrics["train"]

    behaviour = output.get("old_per_token_logps")
    if behaviour is None:  # TRL skips them when the update is on-policy; stored and appended rows need them
        behaviour, _ = trainer._rollout_logps(output, trainer.model, compute_entropy=False)
    output["old_per_token_logps"] = behaviour

    # Global view of the on-policy batch (identical on every process; groups may straddle processes).
    prompt_ids = acc.gather(acc.pad_across_processes(output["prompt_ids"], dim=1, pad_index=pad_id, pad_first=True))
    prompt_mask = acc.gather(acc.pad_across_processes(output["prompt_mask"], dim=1, pad_index=0, pad_first=True))
    prompts = [prompt_ids[i][prompt_mask[i].bool()].cpu() for i in range(prompt_ids.size(0))]
    completion_ids = trainer._gather_padded(output["completion_ids"]).cpu()
    lengths = trainer._gather_padded(output["completion_mask"]).sum(-1).long().cpu()
    logps = trainer._gather_padded(behaviour).float().cpu()
    advantages = acc.gather(output["advantages"]).float().cpu()
    rewards = weighted_rewards(trainer._rewards_per_func.float().cpu(), trainer.reward_weights.float().cpu())

    # 1. filter: |A| <= threshold leaves the loss (mask 0, advantage 0)
    keep = select_abs_above(output["advantages"], args.eframe_filter_threshold)
    output["completion_mask"] = output["completion_mask"] * keep[:, None].to(output["completion_mask"].dtype)
    output["advantages"] = output["advantages"].masked_fill(~keep, 0.0)
    metrics["groupx/eframe_filtered_fraction"].append(1.0 - float(acc.gather(keep.float()).mean()))

    # 2. exploration rows of the all-fail prompts, kept at |A| > threshold within each extra group
    hard = all_fail_groups(rewards, trainer.num_generations, args.eframe_hard_eps)
    extra = explore(trainer, inputs, hard, prompts) if hard else []
    metrics["groupx/eframe_hard_prompts"].append(float(len(hard)))
    metrics["groupx/eframe_extra_rows"].append(float(len(extra)))

    # 3. the replay buffer takes the trained rows with |A| > threshold
    n = len(prompts)
    high = select_abs_above(advantages, args.eframe_replay_threshold).tolist()
    stored = [(prompts[i], completion_ids[i, : lengths[i]], logps[i, : lengths[i]], float(advantages[i]))
              for i in range(n) if high[i]]
    stored += [r for r in extra if abs(r[3]) > args.eframe_replay_threshold]
    capacity = int(args.eframe_replay_size * n)
    add_to_buffer(state, {"prompt_ids": [r[0] for r in stored], "completion_ids": [r[1] for r in stored],
                          "logps": [r[2] for r in stored], "advantages": [r[3] for r in stored]}, capacity)

    # 4. replay when due
    replayed: list[Row] = []
    size = buffer_size(state)
    if replay_due(state["batches"], args.eframe_replay_freq, size, n):
        generator = torch.Generator().manual_seed(int(args.seed) * 1_000_003 + state["batches"])
        buffer = state["buffer"]
        replayed = [(buffer["prompt_ids"][j], buffer["completion_ids"][j], buffer["logps"][j],
                     float(buffer["advantages"][j])) for j in replay_indices(size, capacity, n, generator)]
    metrics["groupx/eframe_replayed_rows"].append(float(len(replayed)))
    metrics["groupx/eframe_buffer_rows"].append(float(buffer_size(state)))

    output = append_rows(trainer, output, extra + replayed)
    output["num_items_in_batch"] = acc.gather(output["completion_mask"].sum()).sum()  # kept + appended tokens
    return output


@contextlib.contextmanager
def sampling_temperature(trainer: Any, temperature: float) -> Iterator[None]:
    """TRL's generator at `temperature` (its generation config swapped for a copy), as an extra rollout (the trainer's
    per-run generation hooks step aside while `_generating_baseline` is set)."""
    saved_config, saved_flag = trainer.generation_config, trainer._generating_baseline
    hot = copy.deepcopy(saved_config)
    hot.temperature = temperature
    trainer.generation_config, trainer._generating_baseline = hot, True
    try:
        yield
    finally:
        trainer.generation_config, trainer._generating_baseline = saved_config, saved_flag


def explore(trainer: Any, inputs: list[dict[str, Any]], hard: list[int], prompts: list[torch.Tensor]) -> list[Row]:
    """Global exploration rows (identical on every process): `eframe_extra_n` completions per hard group at
    `eframe_extra_temperature`, scored by the run's rewards, advantages within each extra group, rows with
    `|A| > eframe_extra_keep_threshold`, with behaviour log-probs at the trainer's temperature."""
    args, acc = trainer.args, trainer.accelerator
    group, extra_n, pad_id = trainer.num_generations, args.eframe_extra_n, trainer._tokenizer.pad_token_id
    processes, rank = acc.num_processes, acc.process_index
    share = math.ceil(len(hard) / processes)
    mine = hard[rank * share: (rank + 1) * share]
    mine = mine + [hard[-1]] * (share - len(mine))  # same call size everywhere; the repeats' rollouts are discarded
    if processes > 1:
        from accelerate.utils import gather_object

        all_inputs = gather_object(list(inputs))
    else:
        all_inputs = list(inputs)
    rows = [all_inputs[g * group] for g in mine for _ in range(extra_n)]
    gen_prompts = [prompts[g * group].tolist() for g in mine for _ in range(extra_n)]
    was_training = trainer.model.training
    with sampling_temperature(trainer, args.eframe_extra_temperature):
        completions, _ = trainer._generate_single_turn(gen_prompts, None, {}, extra_n)
    trainer.model.train(was_training)
    per_func = score_aside(trainer, rows, completions)  # (P · share · n, K), gathered
    rewards = weighted_rewards(per_func.float().cpu(), trainer.reward_weights.float().cpu())
    scale = "none" if trainer.scale_rewards == "none" else "group"
    adv = group_normalized_advantages(rewards, extra_n, scale_rewards=scale)

    width = max([1] + [len(c) for c in completions])
    local = torch.full((len(completions), width), pad_id, dtype=torch.long)
    local_len = torch.tensor([len(c) for c in completions], dtype=torch.long)
    for i, c in enumerate(completions):
        local[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    device = acc.device
    ids = acc.gather(acc.pad_across_processes(local.to(device), dim=1, pad_index=pad_id)).cpu()
    lens = acc.gather(local_len.to(device)).cpu()

    truncated = torch.zeros(ids.size(0), dtype=torch.bool)
    if trainer.mask_truncated_completions:  # TRL's rule for the rollouts: the last token is neither EOS nor pad
        ends = [*trainer.eos_token_ids, pad_id]
        truncated = torch.tensor([int(lens[r]) == 0 or int(ids[r, lens[r] - 1]) not in ends
                                  for r in range(ids.size(0))])
    chosen: list[tuple[int, int]] = []  # (hard group, row of the gathered extra batch)
    for q in range(processes):
        for j in range(share):
            if q * share + j >= len(hard):
                continue  # a padding repeat
            for k in range(extra_n):
                row = (q * share + j) * extra_n + k
                if abs(float(adv[row])) > args.eframe_extra_keep_threshold and not truncated[row]:
                    chosen.append((hard[q * share + j], row))
    trainer._metrics["train"]["groupx/eframe_extra_reward_mean"].append(
        float(torch.nanmean(rewards.view(processes, share, extra_n)[
            torch.arange(processes * share).view(processes, share) < len(hard)])))
    if not chosen:
        return []
    rows_out = [(prompts[g * group], ids[r, : lens[r]], None, float(adv[r])) for g, r in chosen]
    behaviour = _behaviour_logps(trainer, rows_out)
    return [(p, c, behaviour[i, : c.numel()], a) for i, (p, c, _, a) in enumerate(rows_out)]


def _table(tensors: list[torch.Tensor], width: int, pad: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(tensors), width), pad, dtype=torch.long)
    mask = torch.zeros((len(tensors), width), dtype=torch.long)
    for i, t in enumerate(tensors):
        if t.numel():
            cols = slice(width - t.numel(), width) if side == "left" else slice(0, t.numel())
            ids[i, cols], mask[i, cols] = t, 1
    return ids, mask


def _behaviour_logps(trainer: Any, rows: list[Row]) -> torch.Tensor:
    """`(R, L)` no-grad log-probs of the rows' completions under the current policy at the trainer's temperature
    (every process computes all rows: the same forward count everywhere)."""
    pad_id, device = trainer._tokenizer.pad_token_id, trainer.accelerator.device
    p_ids, p_mask = _table([r[0] for r in rows], max(r[0].numel() for r in rows), pad_id, "left")
    c_ids, c_mask = _table([r[1] for r in rows], max([1] + [r[1].numel() for r in rows]), pad_id, "right")
    batch = {"prompt_ids": p_ids.to(device), "prompt_mask": p_mask.to(device), "completion_ids": c_ids.to(device),
             "completion_mask": c_mask.to(device)}
    logps, _ = trainer._rollout_logps(batch, trainer.model, compute_entropy=False)
    return logps.float().cpu()


def append_rows(trainer: Any, output: dict[str, Any], rows: list[Row]) -> dict[str, Any]:
    """`output` with this process's share of `rows` appended through RePO's `_append`; null rows (no completion
    token, advantage 0) fill the count up to a multiple of `processes × steps_per_generation`."""
    if not rows:
        return output
    acc, pad_id = trainer.accelerator, trainer._tokenizer.pad_token_id
    unit = acc.num_processes * trainer.args.steps_per_generation
    padded = -(-len(rows) // unit) * unit
    rows = rows + [(rows[-1][0], torch.zeros(0, dtype=torch.long), torch.zeros(0), 0.0)] * (padded - len(rows))
    share = padded // acc.num_processes
    mine = rows[acc.process_index * share: (acc.process_index + 1) * share]
    width = max(output["prompt_ids"].size(1), max(r[0].numel() for r in mine))
    table_ids, table_mask = _table([r[0] for r in mine], width, pad_id, "left")
    advantages = torch.tensor([r[3] for r in mine], dtype=torch.float32, device=output["advantages"].device)
    pieces = [(i, r[1], r[2], None) for i, r in enumerate(mine)]
    return _append(output, pieces, advantages, table_ids, table_mask.to(output["prompt_mask"].dtype), pad_id)
