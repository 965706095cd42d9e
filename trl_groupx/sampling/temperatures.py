"""Several sampling temperatures inside one group (`generation_temperatures=[t_0, ..., t_{G-1}]`): completion `j`
of every prompt is sampled at temperature `t_j` — MDP-GRPO's rollout diversity.

MDP-GRPO ("MDP-GRPO: Stabilized Group Relative Policy Optimization for Multi-Constraint Instruction Following",
ACL 2026) draws the G completions of a prompt at G different temperatures ([0.1, 0.4, 0.7, 1.0] with G = 4) so a
group mixes near-greedy and exploratory answers. Official code: m-salmani78/trl@3b375080d799c1a7224de19d37e548a2ed2aa390,
`trl/trainer/grpo_config.py` (`temperature_list`: its length must equal `num_generations`, completion `j` of each
prompt at `temperature_list[j]`) and `trl/trainer/grpo_trainer.py` l.1273-1330 (vLLM colocate: one `generate` per
temperature over the unique prompts, results interleaved prompt-major) and l.1447-1510 (vLLM server mode).

Ours runs on TRL's transformers path: the rows of one generation call (the sampler repeats each prompt G times, so
the row at global position `r` is completion `r mod G` of its prompt) are split by temperature, each subset goes
through TRL's own `_generate_single_turn` with `generation_config.temperature` set to its `t_j` (and through
`generation_micro_group_size` chunks when that is on), and the completions are put back in row order.

Choices and limits:
- Log-probs (ratios, KL, entropies) are computed with TRL's single `temperature` for every row, as in the official
  code (which divides logits by `self.temperature`; its scripts use 1.0): the rollouts are scored under the policy
  at that temperature, not under the temperature that drew them. Set `temperature=1.0` for the paper's setting.
- Evaluation with `num_generations_eval != len(generation_temperatures)` samples every row at `temperature`.
- Refused at config time: `use_vllm=True` and `use_transformers_continuous_batching=True` (the official vLLM paths
  are not reproduced here, and neither is exercised on this package's CPU tests), and multimodal prompts at the
  first generation. The extra baseline completions of `remax`/`aapo` are drawn at the run's `temperature`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

FLAG = "generation_temperatures"


def validate(config: Any) -> None:
    """Config-time checks of `generation_temperatures`."""
    temps = getattr(config, FLAG, None)
    if temps is None:
        return
    if not isinstance(temps, (list, tuple)) or not temps or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in temps):
        raise ValueError(f"{FLAG}={temps!r} must be a list of positive temperatures, one per completion of a group "
                         "(MDP-GRPO: [0.1, 0.4, 0.7, 1.0]), or None.")
    if len(temps) != config.num_generations:
        raise ValueError(f"{FLAG} has {len(temps)} temperatures but num_generations={config.num_generations}: give one "
                         "temperature per completion of a group, or change num_generations.")
    for flag in ("use_vllm", "use_transformers_continuous_batching"):
        if getattr(config, flag, False):
            raise ValueError(f"{FLAG} samples each temperature with transformers generate(); it does not run with "
                             f"{flag}=True yet. Set {flag}=False or unset {FLAG}.")


def row_temperatures(temps: Sequence[float], first_row: int, num_rows: int) -> list[float]:
    """Temperature of each of `num_rows` rows starting at global row `first_row` (completion index = row mod G)."""
    return [float(temps[(first_row + i) % len(temps)]) for i in range(num_rows)]


def generate_at_temperatures(
    trainer: Any, generate: Callable[..., tuple[list, Any]], prompt_ids: list, images: Any,
    multimodal_fields: dict, num_generations: int, has_tool_images: bool = False,
) -> tuple[list[list[int]], None]:
    """`generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)` once per temperature, on
    that temperature's rows (this process's slice of the generation batch), reassembled in row order."""
    if images is not None or multimodal_fields:
        raise ValueError(f"{FLAG} supports text prompts only; unset it for multimodal prompts.")
    temps = row_temperatures(getattr(trainer.args, FLAG), trainer.accelerator.process_index * len(prompt_ids),
                             len(prompt_ids))
    saved = trainer.generation_config
    completions: list[Any] = [None] * len(prompt_ids)
    try:
        # Every process holds a contiguous slice of whole or partial groups, hence the same temperatures in the
        # same order when G divides its row count: the same number of generate() calls on every process.
        for temperature in sorted(set(temps)):
            rows = [i for i, t in enumerate(temps) if t == temperature]
            config = saved.__class__.from_dict(saved.to_dict())
            config.temperature = temperature
            trainer.generation_config = config
            subset, _ = generate([prompt_ids[i] for i in rows], None, {}, num_generations, has_tool_images)
            for i, ids in zip(rows, subset, strict=True):
                completions[i] = ids
    finally:
        trainer.generation_config = saved
    return completions, None

