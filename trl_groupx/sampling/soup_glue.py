"""SOUP's trainer glue: mix stored prefixes into the training generation batch (formulas and choices: `soup.py`).

Called at the end of TRL's generation and scoring, before the other stages (`GRPOTrainer._generate_and_score_
completions`). Every process computes the same plan from the gathered batch and the buffer (identical on every
process), rewrites the mixed rows it owns, and joins the same generation and scoring calls (equal sizes, filler rows).
"""

from __future__ import annotations

from typing import Any

import torch

from ..advantages._prompt_keys import prompt_keys_from_ids
from .baseline_rollouts import continue_prefixes
from .reference_injection import _recompute_logps, _rescore, replace_completions
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


def _plan(buffer: dict, keys: list[int], group_size: int, k: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(global row, prefix ids, prefix log-probs) of every mixed row: the last `k` slots of each group whose prompt
    has stored non-empty prefixes."""
    plan = []
    for g in range(len(keys) // group_size):
        entry = buffer.get(keys[g * group_size])
        if entry is None:
            continue
        for slot, ids, logps in zip(mixed_slots(group_size, k), entry["ids"], entry["logps"]):
            if ids.numel():
                plan.append((g * group_size + slot, ids, logps))
    return plan


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


def mix_prefix_rollouts(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """SOUP on one training generation batch: returns the local `output` with the mixed rows rewritten (prefix +
    on-policy continuation, behaviour log-probs per token) and updates `trainer._rewards_per_func` at those rows and
    the prefix buffer."""
    args, acc = trainer.args, trainer.accelerator
    fraction, k, group_size = args.soup_prefix_fraction, args.soup_mixed_rollouts, trainer.num_generations
    metrics = trainer._metrics["train"]
    if fraction == 0:  # no prefix is ever stored: GRPO, without the extra forward
        metrics["groupx/soup_mixed_rows"].append(0.0)
        return output
    local_n = output["completion_ids"].size(0)
    start = acc.process_index * local_n
    behaviour = output.get("old_per_token_logps")
    if behaviour is None:  # an on-policy batch: the sampling policy is the current one, needed for the stored rows
        behaviour = _stored_rows_logps(trainer, output, start, group_size, k)
    keys, ids, mask, logps = _global_batch(trainer, output, behaviour)
    buffer = trainer.variant_state[VARIANT_ID].setdefault("prompts", {})
    plan = _plan(buffer, keys, group_size, k)  # from earlier batches only
    _store(buffer, keys, ids, mask, logps, group_size, k, fraction, set(trainer.eos_token_ids))
    metrics["groupx/soup_mixed_rows"].append(float(len(plan)))
    if not plan:
        return output
    if "old_per_token_logps" not in output:  # mixed rows need theirs: every other row's is the current policy's
        current, _ = trainer._rollout_logps(output, trainer.model, compute_entropy=False)
        output = {**output, "old_per_token_logps": current * output["completion_mask"]}
    metrics["groupx/soup_prefix_tokens_mean"].append(sum(p.numel() for _, p, _ in plan) / len(plan))

    # this process's mixed rows: continue their prefixes (same budget and call size on every process)
    mine = [(row - start, prefix, prefix_logps) for row, prefix, prefix_logps in plan if start <= row < start + local_n]
    rows = [r for r, _, _ in mine]
    max_length = trainer.max_completion_length
    budget = max(max_length - min(p.numel() for _, p, _ in plan), 1)
    prefixes = [p.tolist() for _, p, _ in mine]
    continuations = continue_prefixes(trainer, output, rows, prefixes, budget)
    new_ids = [(p + c)[:max_length] for p, c in zip(prefixes, continuations, strict=True)]

    output = replace_completions(output, rows, new_ids, trainer._tokenizer.pad_token_id, selector=_SELECTOR)
    if trainer.mask_truncated_completions:  # TRL's rule: a completion without EOS at its end is masked
        ends = [*trainer.eos_token_ids, trainer._tokenizer.pad_token_id]
        for row, seq in zip(rows, new_ids, strict=True):
            if not seq or seq[-1] not in ends:
                output["completion_mask"][row] = 0
    _recompute_logps(trainer, output, rows)  # current-policy (and reference) log-probs of the whole new rows
    old = output["old_per_token_logps"]
    for row, (_, _, prefix_logps) in zip(rows, mine, strict=True):
        old[row] = mixed_behaviour_logps(old[row], prefix_logps) * output["completion_mask"][row]
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    output["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()

    # score the mixed rows (gathered, process order) and put their rewards in the global batch
    per_process = [[row for row, _, _ in plan if p * local_n <= row < (p + 1) * local_n]
                   for p in range(acc.num_processes)]
    count = max(len(r) for r in per_process)
    scored = _rescore(trainer, inputs, rows, new_ids, count)  # (P × count, K)
    targets = torch.tensor([row for r in per_process for row in r], dtype=torch.long)
    source = torch.tensor([p * count + j for p, r in enumerate(per_process) for j in range(len(r))], dtype=torch.long)
    rewards_per_func = trainer._rewards_per_func.clone()
    rewards_per_func[targets.to(rewards_per_func.device)] = scored.index_select(
        0, source.to(scored.device)).to(rewards_per_func)
    trainer._rewards_per_func = rewards_per_func
    return output
