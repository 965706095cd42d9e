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
from .reference_injection import _recompute_logps, replace_completions

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
                    "rewards": per_func[c].float().clone(), "scores": rewards[c].float().clone()}
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
        chosen = []
        for index, round_ in zip(committed, rounds, strict=True):
            entry = self._entry(int(index), int(round_))
            rng = np.random.default_rng([int(seed), step, int(index)])
            pick = max_variance_subset((entry["scores"] >= threshold).tolist(), self.reused, rng)
            chosen.append({"round": entry["round"], "ids": [entry["ids"][i] for i in pick],
                           "rewards": entry["rewards"][pick]})
        state["pilot_rollouts"] = {int(i): self._entry(int(i), int(r))
                                   for i, r in zip(state["buffer_index"].tolist(), state["buffer_round"].tolist())}
        state["commit_pilots"] = chosen


def reuse_pilot_rollouts(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """The `after_generation` hook: rows `g·G … g·G + n_eff − 1` of committed group `g` become its chosen pilot
    rollouts (completions from `state["commit_pilots"]`, per-function rewards into `trainer._rewards_per_func`), with
    the current and reference models' log-probs recomputed. Returns the local `output`."""
    state = trainer.variant_state[VARIANT_ID]
    chosen = state.pop("commit_pilots", None)
    metrics = trainer._metrics["train"]
    if not chosen:
        metrics["groupx/pilot_commit_reused_rows"].append(0.0)
        return output
    acc, group_size = trainer.accelerator, trainer.num_generations
    local_n = output["completion_ids"].size(0)
    start = acc.process_index * local_n
    if len(chosen) * group_size != local_n * acc.num_processes:
        raise RuntimeError(f"{_SELECTOR}: {local_n * acc.num_processes} rollouts for {len(chosen)} committed groups "
                           f"of {group_size}.")
    plan = [(g * group_size + slot, ids, entry["rewards"][slot])
            for g, entry in enumerate(chosen) for slot, ids in enumerate(entry["ids"])]
    mine = [(row - start, ids) for row, ids, _ in plan if start <= row < start + local_n]
    rows, ids = [r for r, _ in mine], [i.tolist() for _, i in mine]
    output = replace_completions(output, rows, ids, trainer._tokenizer.pad_token_id, selector=_SELECTOR)
    if trainer.mask_truncated_completions:  # TRL's rule: a completion without EOS at its end is masked
        ends = [*trainer.eos_token_ids, trainer._tokenizer.pad_token_id]
        for row, seq in zip(rows, ids, strict=True):
            if not seq or seq[-1] not in ends:
                output["completion_mask"][row] = 0
    _recompute_logps(trainer, output, rows)
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    output["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()
    rewards_per_func = trainer._rewards_per_func.clone()
    targets = torch.tensor([row for row, _, _ in plan], dtype=torch.long, device=rewards_per_func.device)
    rewards_per_func[targets] = torch.stack([r for _, _, r in plan]).to(rewards_per_func)
    trainer._rewards_per_func = rewards_per_func
    rounds = state["committed_rounds"].double()
    metrics["groupx/pilot_commit_reused_rows"].append(float(len(plan)))
    metrics["groupx/pilot_commit_pilot_age"].append(float((rounds[:, 1] - rounds[:, 0]).mean()))
    return output
