"""SOUP's trainer glue: mix stored prefixes into the training generation batch (formulas and choices: `soup.py`).

Two points, one generation call. `generate_with_prefixes` wraps TRL's `_generate_single_turn` for the batch's own
generation: a mixed row is generated from `prompt + stored prefix`, and its completion is the prefix followed by the
continuation, so TRL scores, masks and logs it as any other row. `mix_prefix_rollouts` (after TRL's generation and
scoring, before the other stages) gives the mixed rows their behaviour log-probs and stores this visit's prefixes.
Every process plans from the buffer (identical on every process) and its own rows' prompts; TRL's call keeps its
size.
"""

from __future__ import annotations

from typing import Any

import torch

from ..advantages._prompt_keys import prompt_key, prompt_keys_from_ids
from .soup import VARIANT_ID, mixed_behaviour_logps, mixed_slots, prefix_length, stored_slots

_SELECTOR = f"rollout_filter={VARIANT_ID!r}"


def check_soup(trainer: Any) -> None:
    """Trainer-construction refusals (what the config cannot see), naming the flag and the fix."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"{_SELECTOR} continues stored prefixes with the trainer's own single-turn generator; it "
                         "cannot reproduce a rollout_func, tools or environments. Drop them, or unset rollout_filter.")


def _global_batch(trainer: Any, output: dict[str, Any], behaviour: torch.Tensor) -> tuple[list[int], torch.Tensor,
                                                                                          torch.Tensor, torch.Tensor]:
    """Prompt keys `(N,)`, completion ids, completion mask and behaviour log-probs `(N, T)` of the gathered batch."""
    acc, pad = trainer.accelerator, trainer._tokenizer.pad_token_id
    prompt_ids = acc.gather(acc.pad_across_processes(output["prompt_ids"], dim=1, pad_index=pad, pad_first=True))
    prompt_mask = acc.gather(acc.pad_across_processes(output["prompt_mask"], dim=1, pad_index=0, pad_first=True))
    keys = prompt_keys_from_ids(prompt_ids, prompt_mask).tolist()
    return (keys, trainer._gather_padded(output["completion_ids"]).cpu(),
            trainer._gather_padded(output["completion_mask"]).cpu(), trainer._gather_padded(behaviour).float().cpu())


def _stored_rows_logps(trainer: Any, output: dict[str, Any], start: int, group_size: int, k: int) -> torch.Tensor:
    """`(B, T)` current-policy log-probs of this process's rows in a stored slot (zero elsewhere): the only
    behaviour log-probs the buffer keeps, so the no-grad forward runs on `k/G` of the rows."""
    slots = set(stored_slots(group_size, k))
    rows = [i for i in range(output["completion_ids"].size(0)) if (start + i) % group_size in slots]
    logps = torch.zeros(output["completion_ids"].shape, dtype=torch.float32, device=output["completion_ids"].device)
    if rows:
        index = torch.tensor(rows, device=logps.device)
        sub = {key: output[key].index_select(0, index)
               for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        current, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
        logps[index] = (current * sub["completion_mask"]).float()
    return logps


def _store(buffer: dict, keys: list[int], ids: torch.Tensor, mask: torch.Tensor, logps: torch.Tensor,
           group_size: int, k: int, fraction: float, eos_ids: set[int]) -> None:
    """Replace each prompt's stored prefixes by those of its on-policy rollouts in this batch (`stored_slots`)."""
    for g in range(len(keys) // group_size):
        entry = {"ids": [], "logps": []}
        for slot in stored_slots(group_size, k):
            row = g * group_size + slot
            n = int(mask[row].sum())
            m = prefix_length(n, n > 0 and int(ids[row, n - 1]) in eos_ids, fraction)
            entry["ids"].append(ids[row, :m].to(torch.int64).clone())
            entry["logps"].append(logps[row, :m].clone())
        buffer[keys[g * group_size]] = entry


def _plan(buffer: dict, keys: list[int], group_size: int, k: int, start: int = 0
          ) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(row, prefix ids, prefix log-probs) of every mixed row among rows `start, start + 1, …` (keyed `keys`): the
    last `k` slots of each group whose prompt has stored non-empty prefixes; the `j`-th mixed slot takes the `j`-th
    stored prefix. Rows are numbered from 0 in `keys`."""
    slots = mixed_slots(group_size, k)
    plan = []
    for i, key in enumerate(keys):
        slot = (start + i) % group_size
        entry = buffer.get(key) if slot in slots else None
        if entry is not None and entry["ids"][slots.index(slot)].numel():
            plan.append((i, entry["ids"][slots.index(slot)], entry["logps"][slots.index(slot)]))
    return plan


def plan_prefixes(trainer: Any, prompt_ids: list[list[int]]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """This process's mixed rows of the batch being generated (from earlier batches' prefixes only): local row →
    (stored prefix ids, their log-probs)."""
    args, acc = trainer.args, trainer.accelerator
    buffer = trainer.variant_state[VARIANT_ID].get("prompts", {})
    if args.soup_prefix_fraction == 0 or not buffer:
        return {}
    keys = [prompt_key(torch.tensor(ids, dtype=torch.int64)) for ids in prompt_ids]
    plan = _plan(buffer, keys, trainer.num_generations, args.soup_mixed_rollouts,
                 acc.process_index * len(prompt_ids))
    return {i: (ids, logps) for i, ids, logps in plan}


def generate_with_prefixes(trainer: Any, generate: Any, prompt_ids: list[list[int]], images: Any,
                           multimodal_fields: Any, num_generations: int, has_tool_images: bool = False) -> Any:
    """TRL's `_generate_single_turn` (`generate`) on the training batch with the mixed rows generated from
    `prompt + prefix`; their completions are `prefix + continuation`, cut at `max_completion_length` (the continuation
    has TRL's `max_completion_length` budget: past it, the cut, as a shorter budget would give). Records the plan
    in `trainer._soup_plan` for `mix_prefix_rollouts`."""
    plan = plan_prefixes(trainer, prompt_ids)
    trainer._soup_plan = plan
    if not plan:
        return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
    prompts = [list(ids) + plan[i][0].tolist() if i in plan else ids for i, ids in enumerate(prompt_ids)]
    completion_ids, logprobs = generate(prompts, images, multimodal_fields, num_generations, has_tool_images)
    limit = trainer.max_completion_length
    completion_ids = [(plan[i][0].tolist() + list(ids))[:limit] if i in plan else ids
                      for i, ids in enumerate(completion_ids)]
    return completion_ids, logprobs


def mix_prefix_rollouts(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """SOUP after one training generation batch: the mixed rows' behaviour log-probs (stored ones on the prefix, the
    generating policy's on the continuation), then this visit's prefixes into the buffer. Returns the local
    `output`."""
    args, acc = trainer.args, trainer.accelerator
    fraction, k, group_size = args.soup_prefix_fraction, args.soup_mixed_rollouts, trainer.num_generations
    metrics = trainer._metrics["train"]
    plan = getattr(trainer, "_soup_plan", None) or {}
    trainer._soup_plan = None
    if fraction == 0:  # no prefix is ever stored: GRPO, without the extra forward
        metrics["groupx/soup_mixed_rows"].append(0.0)
        return output
    counts = torch.tensor([len(plan), sum(p.numel() for p, _ in plan.values())], device=acc.device)
    mixed, prefix_tokens = (acc.gather(counts[None]).sum(0) if acc.num_processes > 1 else counts).tolist()
    metrics["groupx/soup_mixed_rows"].append(float(mixed))
    if mixed:
        if "old_per_token_logps" not in output:  # mixed rows need theirs: every other row's is the current policy's
            current, _ = trainer._rollout_logps(output, trainer.model, compute_entropy=False)
            output = {**output, "old_per_token_logps": current * output["completion_mask"]}
        old = output["old_per_token_logps"]
        for row, (_, prefix_logps) in plan.items():
            old[row] = mixed_behaviour_logps(old[row], prefix_logps) * output["completion_mask"][row]
        metrics["groupx/soup_prefix_tokens_mean"].append(prefix_tokens / mixed)
    local_n = output["completion_ids"].size(0)
    behaviour = output.get("old_per_token_logps")
    if behaviour is None:  # an on-policy batch: the sampling policy is the current one, needed for the stored rows
        behaviour = _stored_rows_logps(trainer, output, acc.process_index * local_n, group_size, k)
    keys, ids, mask, logps = _global_batch(trainer, output, behaviour)
    buffer = trainer.variant_state[VARIANT_ID].setdefault("prompts", {})
    _store(buffer, keys, ids, mask, logps, group_size, k, fraction, set(trainer.eos_token_ids))
    return output
