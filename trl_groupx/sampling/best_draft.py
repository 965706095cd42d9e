"""iGRPO stage 1: the trainer glue behind `rollout_filter="igrpo"` (see `igrpo.py` for the method and choices).

`condition_on_best_draft` samples `k` drafts per prompt through TRL's own generator, scores them with the run's
reward functions (`_scoring.score_aside`, gathered across processes), picks each prompt's best draft and returns
the batch's rows with their prompts rewritten to `prompt ⊕ template(best draft)`. TRL then generates, scores and
trains the stage-2 rollouts from those rows. The index bookkeeping (`group_first_rows`, `draft_positions`) is pure
and unit-tested.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from accelerate.utils import gather_object

from ._scoring import score_aside
from .baseline_rollouts import generate_aside
from .dapo_dynamic_sampling import weighted_rewards
from .igrpo import VARIANT_ID, best_draft_indices, conditioned_prompt


def check_best_draft(trainer: Any) -> None:
    """Trainer-construction refusals (what the config cannot see), naming the flag and the fix."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} samples its drafts with the trainer's own single-turn "
                         "generator and rewrites the prompts TRL generates from; it cannot reproduce a rollout_func, "
                         "tools or environments. Drop them, or unset rollout_filter.")


def group_first_rows(local_n: int, start: int, group_size: int) -> list[int]:
    """Local rows (of a process whose slice starts at global row `start`) that open a group: the rows whose
    group's drafts this process samples."""
    return [i for i in range(local_n) if (start + i) % group_size == 0]


def draft_positions(num_processes: int, local_n: int, group_size: int, num_drafts: int,
                    padded_to: int) -> torch.Tensor:
    """`(P, k)` index of each prompt's drafts in the gathered draft list (`num_processes × padded_to` entries,
    process by process; process `p` lists `k` drafts for each of its `group_first_rows`, in row order, then filler).
    Prompt `g` (global rows `g·G ... g·G+G-1`) is drafted by the process holding row `g·G`."""
    positions = []
    for p in range(num_processes):
        for slot, _ in enumerate(group_first_rows(local_n, p * local_n, group_size)):
            base = p * padded_to + slot * num_drafts
            positions.append(list(range(base, base + num_drafts)))
    return torch.tensor(positions, dtype=torch.long).view(-1, num_drafts)


def condition_on_best_draft(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This process's rows with each prompt replaced by its stage-2 prompt (module docstring). Every process must
    call it (one generation call and one scoring gather each)."""
    acc = trainer.accelerator
    args = trainer.args
    group_size = trainer.num_generations
    k = args.igrpo_num_drafts or group_size
    local_n, rank = len(inputs), acc.process_index
    owners = group_first_rows(local_n, rank * local_n, group_size)
    rows = [i for i in owners for _ in range(k)]
    count = len(rows)
    padded_to = int(acc.gather(torch.tensor([count], device=acc.device)).max()) if acc.num_processes > 1 else count
    rows = rows + [rows[0] if rows else 0] * (padded_to - count)  # filler: same call size on every process
    drafted = [inputs[i] for i in rows]
    prompt_ids, images, multimodal_fields = trainer._tokenize_prompts([copy.deepcopy(x["prompt"]) for x in drafted])
    if images is not None or multimodal_fields:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} supports text prompts only.")
    draft_ids = generate_aside(trainer, prompt_ids)  # one draft per row

    rewards = weighted_rewards(score_aside(trainer, drafted, draft_ids), trainer.reward_weights)  # (P·padded_to,)
    texts = trainer.processing_class.batch_decode(draft_ids, skip_special_tokens=True)
    texts = gather_object(texts) if acc.num_processes > 1 else texts
    positions = draft_positions(acc.num_processes, local_n, group_size, k, padded_to).to(rewards.device)
    draft_rewards = rewards[positions]  # (prompts, k), identical on every process
    best = best_draft_indices(draft_rewards)

    conditioned = []
    for i, row in enumerate(inputs):
        g = (rank * local_n + i) // group_size
        j = int(best[g])
        draft = None if j < 0 else texts[int(positions[g, j])]
        prompt = row["prompt"] if draft is None else conditioned_prompt(row["prompt"], draft,
                                                                        args.igrpo_draft_template)
        conditioned.append({**row, "prompt": prompt, "igrpo_draft": draft, "igrpo_prompt": row["prompt"]})

    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    chosen = draft_rewards.gather(1, best.clamp(min=0).unsqueeze(1)).squeeze(1)[best >= 0]
    metrics["groupx/igrpo_draft_reward_mean"].append(torch.nanmean(draft_rewards).item())
    metrics["groupx/igrpo_best_draft_reward_mean"].append(chosen.mean().item() if chosen.numel() else float("nan"))
    metrics["groupx/igrpo_prompts_without_draft"].append(float((best < 0).float().mean().item()))
    return conditioned
