"""Baseline rollouts: one extra completion per prompt (greedy, current policy: ReMax) or per rollout (sampled from
the frozen reference model: AAPO), scored by the run's own reward functions.

The advantage stage receives the result as `greedy_baseline_rewards` / `reference_sample_rewards`: a global `(N,)`
tensor aligned with the rollouts (every rollout of a group sees its prompt's greedy baseline).

Generation goes through TRL's own `_generate_single_turn` (transformers `generate`, or continuous batching), so
whatever TRL does for the model wrappers (DeepSpeed ZeRO-3 parameter gathering, FSDP `summon_full_params`) applies;
every process makes exactly one generation call with the same number of prompts (shorter lists are padded with a
repeat), so the collectives of sharded engines stay in lockstep. vLLM is refused when the config is built
(`reject_vllm`), `rollout_func`, tools and environments when the trainer is (`check_baseline_rollouts`): their
generation is not the trainer's to redirect.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.utils import is_peft_model
from trl.trainer.utils import use_adapter

from ._scoring import score_aside

# requirement name -> which policy generates the baseline and how many completions it draws
BASELINE_REQUIREMENTS = {"greedy_baseline_rewards": "greedy", "reference_sample_rewards": "reference"}


def reject_vllm(config: Any, variant_id: str) -> None:
    """Config-time refusal (the variants' `validate` hook): the baseline generation is transformers-only."""
    if getattr(config, "use_vllm", False):
        raise ValueError(f"advantage_estimator={variant_id!r} generates its baseline completions with transformers "
                         "`generate`; it does not run with use_vllm=True yet. Set use_vllm=False, or use another "
                         "advantage_estimator.")


def check_baseline_rollouts(trainer: Any, variant_id: str, requirement: str) -> None:
    """Trainer-construction refusals (what the config cannot see), naming the flag and the fix."""
    flag = f"advantage_estimator={variant_id!r}"
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"{flag} re-generates each prompt with the trainer's own single-turn generator; it cannot "
                         "reproduce a rollout_func, tools or environments. Drop them, or use another "
                         "advantage_estimator.")
    if BASELINE_REQUIREMENTS[requirement] == "reference" and trainer.ref_model is None and not is_peft_model(
            trainer.model):
        raise ValueError(f"{flag} samples from the frozen reference model, and with beta=0 and full fine-tuning "
                         "there is none: train a LoRA adapter (the base model is the reference) or set beta > 0 "
                         "(TRL then loads a ref_model, and also adds its loss-side KL).")


def _first_rows_of_groups(local_n: int, start: int, group_size: int) -> list[int]:
    """Local rows that open a group, plus row 0 when this process's slice starts inside one."""
    return [i for i in range(local_n) if (start + i) % group_size == 0 or i == 0]


@contextlib.contextmanager
def generating_with_model(trainer: Any, model: Any) -> Iterator[None]:
    """TRL's generator with `model` (a frozen, prepared causal LM) in place of the trained one: TRL's
    `_generate_single_turn` generates with `trainer.model_wrapped` and nothing else reads it during generation."""
    saved_wrapped = trainer.model_wrapped
    trainer.model_wrapped = model
    try:
        yield
    finally:
        trainer.model_wrapped = saved_wrapped


@contextlib.contextmanager
def _generating_with(trainer: Any, policy: str) -> Iterator[None]:
    """Greedy: the generation config with `do_sample=False`. Reference: the adapter disabled (LoRA; TRL's `ref`
    adapter when the model already carried one) or TRL's `ref_model` in place of the trained model."""
    if policy == "greedy":
        saved = trainer.generation_config
        greedy = copy.deepcopy(saved)
        greedy.do_sample, greedy.temperature, greedy.top_p, greedy.top_k, greedy.min_p = False, None, None, None, None
        trainer.generation_config = greedy
        try:
            yield
        finally:
            trainer.generation_config = saved
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    if is_peft_model(model):
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            yield
        return
    with generating_with_model(trainer, trainer.ref_model):
        yield


@contextlib.contextmanager
def max_new_tokens(trainer: Any, budget: int) -> Iterator[None]:
    """TRL's generator with at most `budget` new tokens (a copy of the run's generation config, restored after):
    extra generations that continue a prefix (EDGE-GRPO's reflect branch, SPO-chain's Monte-Carlo values)."""
    saved = trainer.generation_config
    limited = copy.deepcopy(saved)
    limited.max_new_tokens = budget
    trainer.generation_config = limited
    try:
        yield
    finally:
        trainer.generation_config = saved


def generate_aside(trainer: Any, prompt_ids: list[list[int]], num_generations: int = 1) -> list[list[int]]:
    """Completions that are not the batch's rollouts (baselines, drafts, hints, pilots, profiles, continuations):
    TRL's own `_generate_single_turn` at the run's base sampling settings, with the per-batch generation hooks off
    (`trainer._generating_baseline`) and the model's train/eval mode restored after. Callers wrap it in their own
    contexts (`generating_with_model`, `max_new_tokens`)."""
    was_training = trainer.model.training
    trainer._generating_baseline = True
    try:
        completion_ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, num_generations)
    finally:
        trainer._generating_baseline = False
        trainer.model.train(was_training)
    return completion_ids


def continue_prefixes(trainer: Any, output: dict[str, Any], rows: list[int], prefixes: list[list[int]],
                      budget: int) -> list[list[int]]:
    """The policy's continuation (at most `budget` new tokens, the run's base sampling settings) of `prompt + prefix`
    for each of this process's local `rows` of `output`: EDGE-GRPO's reflect branch, SOUP's mixed rollouts. Every
    process makes one generation call of the same size (filler: its row 0 continuing its own completion), because
    generation may gather parameters across processes; `budget` must be the same on every process."""
    acc = trainer.accelerator
    count = len(rows)
    padded_to = int(acc.gather(torch.tensor([count], device=acc.device)).max()) if acc.num_processes > 1 else count
    if padded_to == 0:
        return []
    if not rows:  # filler only: row 0 with its own response as the prefix
        rows, prefixes = [0], [output["completion_ids"][0][output["completion_mask"][0].bool()].tolist()]
    fill_rows = rows + [rows[0]] * (padded_to - len(rows))
    fill_prefixes = prefixes + [prefixes[0]] * (padded_to - len(prefixes))
    prompt_ids = [output["prompt_ids"][r][output["prompt_mask"][r].bool()].tolist() + list(prefix)
                  for r, prefix in zip(fill_rows, fill_prefixes)]
    with max_new_tokens(trainer, budget):
        continuations = generate_aside(trainer, prompt_ids)
    return [list(c) for c in continuations[:count]]


def baseline_rewards(trainer: Any, inputs: list[dict[str, Any]], requirement: str, group_size: int) -> torch.Tensor:
    """Global `(N,)` baseline rewards for the generation batch whose local rows are `inputs`.

    Greedy: one completion per prompt (the first local row of each group), shared by the group across processes.
    Reference: one sampled completion per rollout. Rewards are the weighted sum of the reward functions, as for
    the rollouts (NaN when every function returned None)."""
    policy = BASELINE_REQUIREMENTS[requirement]
    acc = trainer.accelerator
    local_n = len(inputs)
    start = acc.process_index * local_n
    rows = _first_rows_of_groups(local_n, start, group_size) if policy == "greedy" else list(range(local_n))
    # Same number of prompts on every process (one generate call each): pad with the last row.
    count = len(rows)
    padded_to = int(acc.gather(torch.tensor([count], device=acc.device)).max()) if acc.num_processes > 1 else count
    rows = rows + [rows[-1]] * (padded_to - count)
    chosen = [inputs[i] for i in rows]
    prompts = [copy.deepcopy(x["prompt"]) for x in chosen]
    prompt_ids, images, multimodal_fields = trainer._tokenize_prompts(prompts)
    if images is not None or multimodal_fields:
        raise ValueError("Baseline rollouts (remax, aapo) support text prompts only.")
    with _generating_with(trainer, policy):  # one completion per chosen row
        completion_ids = generate_aside(trainer, prompt_ids)
    per_func = score_aside(trainer, chosen, completion_ids)  # gathered: (P · padded_to, K)
    weights = trainer.reward_weights.to(per_func.device)
    scored = (per_func * weights).nansum(dim=1)
    scored[torch.isnan(per_func).all(dim=1)] = torch.nan  # (P · padded_to,)
    # Each local row points at its baseline: its own sample, or its group's greedy completion (the process holding
    # the group's first row in this slice made it; a group split across processes uses its first piece's).
    if policy == "greedy":
        owner = torch.tensor([max(r for r in rows[:count] if r <= i) for i in range(local_n)])
    else:
        owner = torch.arange(local_n)
    index = torch.tensor([rows.index(int(o)) for o in owner], device=acc.device) + acc.process_index * padded_to
    index = acc.gather(index) if acc.num_processes > 1 else index
    result = scored[index]
    if policy == "greedy":  # a group split across processes takes its first piece's baseline
        result = result.view(-1, group_size)[:, :1].expand(-1, group_size).reshape(-1)
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode][f"groupx/{policy}_baseline_reward_mean"].append(torch.nanmean(scored).item())
    return result
