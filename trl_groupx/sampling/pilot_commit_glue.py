"""Pilot-Commit's trainer glue (formulas and choices: `pilot_commit.py`): generate and score the pilot rollouts, keep
those of the buffered prompts in the variant's state, and train a committed prompt's pilot rollouts in its group.

Every process generates its slice of a pilot round and gathers the rewards and the completions, so the buffer, its
stored rollouts and every choice are identical on every process.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object

from ._scoring import score_aside
from .baseline_rollouts import generate_aside
from .dapo_dynamic_sampling import weighted_rewards
from .pilot_commit import VARIANT_ID, max_variance_subset

_SELECTOR = f"rollout_filter={VARIANT_ID!r}"


def pilot_rollouts(trainer: Any, indices: list[int], samples: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                            list[list[list[int]]]]:
    """`samples` completions per candidate prompt from the current policy at the run's sampling settings, scored by
    the run's reward functions: `(C, samples)` weighted rewards (NaN when every reward function returned None),
    `(C, samples, K)` per-function rewards and the completions `[candidate][sample] -> ids`, all gathered. The
    `C · samples` rows are split evenly over the processes (the last one repeated to equal lengths: one generate
    call of the same size everywhere)."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"{_SELECTOR} pilots prompts with the trainer's own single-turn generator; it cannot "
                         "reproduce a rollout_func, tools or environments. Drop them.")
    acc = trainer.accelerator
    rows = [i for i in indices for _ in range(samples)]
    per_process = -(-len(rows) // acc.num_processes)
    mine = rows[acc.process_index * per_process:(acc.process_index + 1) * per_process]
    mine = mine + [rows[-1]] * (per_process - len(mine))
    inputs = [trainer.train_dataset[i] for i in mine]
    prompt_ids, images, multimodal_fields = trainer._tokenize_prompts([copy.deepcopy(x["prompt"]) for x in inputs])
    if images is not None or multimodal_fields:
        raise ValueError(f"{_SELECTOR} supports text prompts only.")
    completion_ids = [list(c) for c in generate_aside(trainer, prompt_ids)]  # no per-batch hooks on the pilots
    per_func = score_aside(trainer, inputs, completion_ids)[: len(rows)].cpu()  # (P · per_process, K), gathered
    completions = gather_object(completion_ids) if acc.num_processes > 1 else completion_ids
    rewards = weighted_rewards(per_func, trainer.reward_weights.cpu())
    shaped = [completions[c * samples:(c + 1) * samples] for c in range(len(indices))]
    return rewards.view(len(indices), samples), per_func.view(len(indices), samples, -1), shaped


class PilotRecorder:
    """The pilot callback of one generation batch's `commit_rounds`, which also keeps the pilot rollouts when
    committed groups reuse them (`reused > 0`)."""

    def __init__(self, trainer: Any, state: dict, samples: int, reused: int) -> None:
        self.trainer, self.state, self.samples, self.reused = trainer, state, samples, reused
        self.latest: dict[tuple[int, int], dict[str, Any]] = {}  # (pilot round, prompt) -> rollouts, this batch

    def pilot(self, indices: list[int]) -> torch.Tensor:
        """`(C, samples)` weighted pilot rewards (`commit_rounds`' callback); keeps the rollouts."""
        rewards, per_func, completions = pilot_rollouts(self.trainer, indices, self.samples)
        if self.reused:
            round_ = int(self.state["round"])  # commit_rounds advances it after this call
            for c, index in enumerate(indices):
                self.latest[(round_, int(index))] = {
                    "round": round_, "ids": [torch.tensor(ids, dtype=torch.int64) for ids in completions[c]],
                    "rewards": per_func[c].float().clone()}
        return rewards

    def _entry(self, index: int, round_: int) -> dict[str, Any]:
        entry = self.latest.get((round_, index)) or self.state.get("pilot_rollouts", {}).get(index)
        if entry is None or entry["round"] != round_:
            raise RuntimeError(f"{_SELECTOR}: the pilot rollouts of prompt {index} (pilot round {round_}) were not "
                               "kept; the checkpoint's state does not match this configuration.")
        return entry

    def keep_for_training(self, committed: list[int], seed: int) -> None:
        """After `commit_rounds`: `state["commit_pilots"]` = the pilots each committed group trains (response rule
        `max_variance_subset`), and `state["pilot_rollouts"]` = the rollouts of the prompts still buffered."""
        state = self.state
        if not self.reused:
            state.pop("pilot_rollouts", None)
            return
        rounds = state["committed_rounds"][:, 0].tolist()
        threshold, step = float(state["success_threshold"]), int(state["step"])
        weights = self.trainer.reward_weights.detach().cpu()
        chosen = []
        for index, round_ in zip(committed, rounds, strict=True):
            entry = self._entry(int(index), int(round_))
            rng = np.random.default_rng([int(seed), step, int(index)])
            successes = (weighted_rewards(entry["rewards"], weights) >= threshold).tolist()  # NaN: not a success
            pick = max_variance_subset(successes, self.reused, rng)
            chosen.append({"round": entry["round"], "ids": [entry["ids"][i] for i in pick],
                           "rewards": entry["rewards"][pick]})
        state["pilot_rollouts"] = {int(i): self._entry(int(i), int(r))
                                   for i, r in zip(state["buffer_index"].tolist(), state["buffer_round"].tolist())}
        state["commit_pilots"] = chosen


def pilot_slots(chosen: list[dict[str, Any]], group_size: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """`(global row, completion ids, per-function rewards)` of every pilot row of the batch: rows `g·G … g·G +
    n_eff − 1` of committed group `g` hold its chosen pilots (`state["commit_pilots"]`)."""
    return [(g * group_size + slot, ids, entry["rewards"][slot])
            for g, entry in enumerate(chosen) for slot, ids in enumerate(entry["ids"])]


def pilot_rows(trainer: Any, local_n: int) -> dict[int, list[int]]:
    """This process's pilot rows (`pilot_slots`): local row → its completion ids."""
    chosen = trainer.variant_state[VARIANT_ID].get("commit_pilots")
    if not chosen:
        return {}
    acc, group_size = trainer.accelerator, trainer.num_generations
    if len(chosen) * group_size != local_n * acc.num_processes:
        raise RuntimeError(f"{_SELECTOR}: {local_n * acc.num_processes} rollouts for {len(chosen)} committed groups "
                           f"of {group_size}.")
    start = acc.process_index * local_n
    return {row - start: ids.tolist() for row, ids, _ in pilot_slots(chosen, group_size)
            if start <= row < start + local_n}


def generate_with_pilots(trainer: Any, generate: Any, prompt_ids: list[list[int]], images: Any,
                         multimodal_fields: Any, num_generations: int, has_tool_images: bool = False) -> Any:
    """The `generate` hook: TRL's `_generate_single_turn` (`generate`) on the training batch's rows that are not pilot
    rows; the pilot rows get their stored completions, so TRL masks, scores and logs them with the rest and no
    generation is spent on them. A process with nothing to generate still makes the call (on its first prompt, the
    result dropped): generation may gather parameters across processes."""
    pilots = pilot_rows(trainer, len(prompt_ids))
    if not pilots:
        return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
    fresh = [i for i in range(len(prompt_ids)) if i not in pilots]
    completions, _ = generate([prompt_ids[i] for i in fresh or [0]], images, multimodal_fields, num_generations,
                              has_tool_images)
    out: list[list[int]] = [[] for _ in prompt_ids]
    for i, ids in zip(fresh, completions):
        out[i] = list(ids)
    for i, ids in pilots.items():
        out[i] = ids
    return out, None  # transformers generation keeps no sampling log-probs (vLLM is refused)


def reuse_pilot_rollouts(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """The `after_generation` hook: the pilot rows (generated as their stored completions by `generate_with_pilots`)
    take their stored per-function rewards in `trainer._rewards_per_func` (the official reuses the pilot's scores;
    TRL re-scored them, which a non-deterministic reward would change); then the batch's pilots are cleared."""
    state = trainer.variant_state[VARIANT_ID]
    chosen = state.pop("commit_pilots", None)
    metrics = trainer._metrics["train"]
    if not chosen:
        metrics["groupx/pilot_commit_reused_rows"].append(0.0)
        return output
    slots = pilot_slots(chosen, trainer.num_generations)
    rewards_per_func = trainer._rewards_per_func.clone()
    targets = torch.tensor([row for row, _, _ in slots], dtype=torch.long, device=rewards_per_func.device)
    rewards_per_func[targets] = torch.stack([r for _, _, r in slots]).to(rewards_per_func)
    trainer._rewards_per_func = rewards_per_func
    rounds = state["committed_rounds"].double()
    metrics["groupx/pilot_commit_reused_rows"].append(float(len(slots)))
    metrics["groupx/pilot_commit_pilot_age"].append(float((rounds[:, 1] - rounds[:, 0]).mean()))
    return output
