"""RePO's trainer glue: append each prompt's replayed rollouts to the training generation batch.

Called at the end of `GRPOTrainer._generate_and_score_completions` (training only), after the advantage stages have
written the on-policy advantages and before TRL's `_prepare_inputs` shuffles the batch and splits it into
`steps_per_generation` micro-batches. The formulas and choices are documented on `trl_groupx.sampling.repo.repo`.

Why here: every per-row tensor of the batch exists by then, so the replayed rows are appended to all of them at once
(`prompt_ids`, `prompt_mask`, `completion_ids`, `completion_mask`, `old_per_token_logps`, `advantages`, and the row
flag `groupx_replay`), and TRL's `shuffle_sequence_dict` / `split_tensor_dict` carry them aligned; the replayed
row count per process is a multiple of `steps_per_generation`, so the split drops none. `num_items_in_batch` is
recounted over on-policy and replayed loss tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from ..advantages._prompt_keys import prompt_keys_from_ids
from .dapo_dynamic_sampling import pad_to_width
from .repo import (
    VARIANT_ID,
    buffered_entry,
    replay_block_advantages,
    select_replay,
    update_buffer,
    weighted_rewards,
)

# Output keys of TRL 1.16's `_generate_and_score_completions` (text models, transformers generation, beta = 0) that
# the replayed rows extend. Anything else (tool masks, multimodal inputs, vLLM ratios, per-row tensors added by
# other trl_groupx stages) has no value for a replayed row here and is refused.
SUPPORTED_KEYS = frozenset({"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                            "num_items_in_batch", "old_per_token_logps"})
REPLAY_FLAG = "groupx_replay"


def append_replay_rows(trainer: Any, output: dict[str, Any]) -> dict[str, Any]:
    """Retrieve the replayed rollouts of the global batch's prompts, add the batch to the buffer, and return `output`
    with this process's share of the replayed rows appended (see the module docstring)."""
    unknown = set(output) - SUPPORTED_KEYS
    if unknown:
        raise NotImplementedError(
            f"rollout_filter={VARIANT_ID!r} cannot append replayed rows to a batch with {sorted(unknown)} (tool masks, "
            "multimodal inputs, vLLM sampling ratios and per-row tensors of other trl_groupx stages are not "
            "supported); use it with a text-only single-turn setup."
        )
    args, acc = trainer.args, trainer.accelerator
    group_size, pad_id = trainer.num_generations, trainer._tokenizer.pad_token_id
    state = trainer.variant_state[VARIANT_ID]
    device = output["completion_ids"].device

    behaviour = output.get("old_per_token_logps")
    if behaviour is None:  # TRL skips them when the update is on-policy; the buffer needs them for later steps
        behaviour, _ = trainer._rollout_logps(output, trainer.model, compute_entropy=False)

    # The global batch, identical on every process (groups may straddle processes).
    prompt_ids = acc.gather(acc.pad_across_processes(output["prompt_ids"], dim=1, pad_index=pad_id, pad_first=True))
    prompt_mask = acc.gather(acc.pad_across_processes(output["prompt_mask"], dim=1, pad_index=0, pad_first=True))
    completion_ids = trainer._gather_padded(output["completion_ids"]).cpu()
    lengths = trainer._gather_padded(output["completion_mask"]).sum(-1).long().cpu()
    logps = trainer._gather_padded(behaviour).float().cpu()
    rewards_per_func = trainer._rewards_per_func.float().cpu()
    keys = prompt_keys_from_ids(prompt_ids, prompt_mask).tolist()

    # 1. retrieval, from the buffer as it was before this batch
    rows: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (global prompt row, ids, logps, rewards)
    groups = len(keys) // group_size
    replayed_groups = 0
    for g in range(groups):
        entry = state.get("prompts", {}).get(keys[g * group_size])
        if entry is None:
            continue
        chosen = select_replay(entry["rewards"], k=args.repo_k, min_cache=args.repo_min_cache,
                               strategy=args.repo_strategy)
        replayed_groups += bool(chosen)
        rows += [(g * group_size, *buffered_entry(entry, j)) for j in chosen]

    # 2. the buffer takes this batch
    n = len(keys)
    update_buffer(state, keys, [completion_ids[i, : lengths[i]] for i in range(n)],
                  [logps[i, : lengths[i]] for i in range(n)], rewards_per_func,
                  max_cache=args.repo_max_cache, max_prompts=args.repo_max_prompts)

    metrics = trainer._metrics["train"]
    metrics["groupx/repo_replayed_rows"].append(float(len(rows)))
    metrics["groupx/repo_replayed_prompt_fraction"].append(replayed_groups / max(1, groups))
    metrics["groupx/repo_buffer_prompts"].append(float(len(state.get("prompts", {}))))

    output["old_per_token_logps"] = behaviour
    output[REPLAY_FLAG] = torch.zeros(output["completion_ids"].size(0), device=device)
    if not rows:
        return output

    # 3. split advantages of the replayed blocks (k rows per prompt, contiguous)
    rewards = weighted_rewards(torch.stack([r[3] for r in rows]), trainer.reward_weights.float().cpu())
    advantages = replay_block_advantages(rewards, args.repo_k, scale_rewards=trainer.scale_rewards,
                                         eps=args.repo_adv_eps)

    # 4. deal the replayed rows out evenly; null rows (no completion token, advantage 0) fill the count up
    unit = acc.num_processes * args.steps_per_generation
    padded = -(-len(rows) // unit) * unit
    empty_ids, empty_logps = torch.zeros(0, dtype=torch.long), torch.zeros(0)
    rows += [(rows[-1][0], empty_ids, empty_logps, None)] * (padded - len(rows))
    advantages = torch.cat([advantages, advantages.new_zeros(padded - advantages.numel())])
    share = padded // acc.num_processes
    mine = slice(acc.process_index * share, (acc.process_index + 1) * share)
    merged = _append(output, rows[mine], advantages[mine].to(device), prompt_ids, prompt_mask, pad_id)
    merged["num_items_in_batch"] = acc.gather(merged["completion_mask"].sum()).sum()  # on-policy + replayed tokens
    return merged


def _append(output: dict[str, Any], rows: list, advantages: torch.Tensor, prompt_ids: torch.Tensor,
            prompt_mask: torch.Tensor, pad_id: int) -> dict[str, Any]:
    """`output` with `rows` (global prompt row, completion ids, behaviour log-probs, _) appended: prompts left-padded
    and completions right-padded to the wider of the two pieces."""
    device = output["completion_ids"].device
    width = max([output["completion_ids"].size(1), 1] + [r[1].numel() for r in rows])
    r_ids = torch.full((len(rows), width), pad_id, dtype=output["completion_ids"].dtype)
    r_mask = torch.zeros((len(rows), width), dtype=output["completion_mask"].dtype)
    r_logps = torch.zeros((len(rows), width), dtype=output["old_per_token_logps"].dtype)
    for i, (_, ids, logps, _) in enumerate(rows):
        r_ids[i, : ids.numel()] = ids
        r_mask[i, : ids.numel()] = 1
        r_logps[i, : ids.numel()] = logps
    prompt_rows = torch.tensor([r[0] for r in rows], device=prompt_ids.device)
    p_width = prompt_ids.size(1)

    def right(x: torch.Tensor, value: float) -> torch.Tensor:
        return pad_to_width(x, width, "right", value)

    merged = dict(output)
    merged["prompt_ids"] = torch.cat([pad_to_width(output["prompt_ids"], p_width, "left", pad_id),
                                      prompt_ids.index_select(0, prompt_rows).to(device)])
    merged["prompt_mask"] = torch.cat([pad_to_width(output["prompt_mask"], p_width, "left", 0),
                                       prompt_mask.index_select(0, prompt_rows).to(device)])
    merged["completion_ids"] = torch.cat([right(output["completion_ids"], pad_id), r_ids.to(device)])
    merged["completion_mask"] = torch.cat([right(output["completion_mask"], 0), r_mask.to(device)])
    merged["old_per_token_logps"] = torch.cat([right(output["old_per_token_logps"], 0.0), r_logps.to(device)])
    on_adv = output["advantages"]
    if on_adv.dim() == 2:  # per-token advantages of a token stage: a replayed row's advantage on every position
        merged["advantages"] = torch.cat([right(on_adv, 0.0), advantages.to(on_adv.dtype)[:, None].expand(-1, width)])
    else:
        merged["advantages"] = torch.cat([on_adv, advantages.to(on_adv.dtype)])
    if REPLAY_FLAG in output:  # RePO weights its replayed rows; other callers append ordinary rows
        merged[REPLAY_FLAG] = torch.cat([output[REPLAY_FLAG], torch.ones(len(rows), device=device)])
    return merged

