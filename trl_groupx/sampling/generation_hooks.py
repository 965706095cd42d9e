"""Where a sampling variant acts around TRL's generation: one table, read by `GRPOTrainer._generate_and_score_
completions`, instead of one `if rollout_filter == ...` branch per variant in the trainer.

A variant that only keeps or drops rollouts (its registered filter) needs no entry. The others act at one or more
of four points of one generation batch, each a function imported when first called (the modules depend on the
trainer's generation helpers):

1. `before` — `(trainer, inputs) -> inputs`, before TRL generates: rewrite the rows' prompts (iGRPO's best draft,
   RC-GRPO's reward token, SAGE-light's hint, consistency-GRPO's paraphrases) or reset per-batch records (N-GRPO).
2. `after_generation` — `(trainer, inputs, output, generate) -> (inputs, output)`, after TRL's generation and
   scoring, before the rollout stages: regenerate or rewrite rows and update `trainer._rewards_per_func` (DAPO's
   refill, SAGE's re-roll, GCPO's reference injection, LSPO's scaffold, SOUP's prefixes, Pilot-Commit's pilots).
   `generate` is TRL's own `_generate_and_score_completions`, for variants that call it again.
3. `after_stages` — `(trainer, inputs, output) -> output`, right after the advantage and token-weight stages, before
   the objective's per-row inputs are built (RC-GRPO takes its condition tokens out of the loss mask).
4. `append_rows` — `(trainer, inputs, output) -> output`, last, once every per-row tensor exists: rows appended to
   the batch (RePO's replay, EFRame's exploration and replay rows).
5. `generate` — `(trainer, generate, prompt_ids, images, multimodal_fields, num_generations, has_tool_images) ->
   (completion_ids, logprobs)`, around TRL's `_generate_single_turn` for the batch's own generation (not the
   completions generated aside): what some rows are generated from, or which rows need no generation (SOUP's
   prefixes, Pilot-Commit's stored pilot rollouts).

Each point of an entry says whether it also runs on evaluation batches (`always`); by default it runs on training
batches only. Flag-switched mechanisms that are not a `rollout_filter` (EDGE-GRPO's GEC, HAPO's adaptive
temperature) stay in the trainer.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# How a hook function is called; each is adapted to its point's signature (module docstring):
#   "rows":     fn(trainer, inputs) -> inputs
#   "reset":    fn(trainer) -> None
#   "pair":     fn(trainer, inputs, output, generate) -> (inputs, output)
#   "batch":    fn(trainer, inputs, output) -> output
#   "output":   fn(trainer, output) -> output
#   "in_place": fn(trainer, output) -> None (edits output)
#   "wrap":     fn(trainer, generate, *generate_args) -> generate's result
_POINT_CALLS = {"before": ("rows", "reset"), "after_generation": ("pair", "batch", "in_place"),
                "after_stages": ("batch", "output", "in_place"), "append_rows": ("batch", "output", "in_place"),
                "generate": ("wrap",)}


def _adapt(fn: Callable[..., Any], call: str, point: str) -> Callable[..., Any]:
    if call in ("rows", "pair", "wrap") or (call == "batch" and point != "after_generation"):
        return fn
    if call == "reset":
        def before(trainer: Any, inputs: list) -> list:
            fn(trainer)
            return inputs
        return before
    if call == "output":
        return lambda trainer, inputs, output: fn(trainer, output)

    def edit(trainer: Any, inputs: list, output: dict) -> dict:  # "in_place", or "batch" after generation
        result = fn(trainer, inputs, output) if call == "batch" else fn(trainer, output)
        return output if call == "in_place" else result
    if point == "after_generation":
        return lambda trainer, inputs, output, generate: (inputs, edit(trainer, inputs, output))
    return edit


@dataclass(frozen=True)
class Hook:
    """`module:function` (under `trl_groupx.sampling`), called as `call` (see `_POINT_CALLS`); `always`: on
    evaluation batches too."""

    target: str
    call: str
    always: bool = False

    def resolve(self, point: str) -> Callable[..., Any]:
        """The function, adapted to `point`'s signature."""
        if self.call not in _POINT_CALLS[point]:
            raise ValueError(f"A {self.call!r} hook ({self.target}) cannot run at {point!r}.")
        module, function = self.target.split(":")
        return _adapt(getattr(importlib.import_module(f"{__package__}.{module}"), function), self.call, point)


# rollout_filter id -> point -> hook; a variant has at most one hook per point.
HOOKS: dict[str, dict[str, Hook]] = {
    "n_grpo": {"before": Hook("neighbor_mixing:start_generation_batch", "reset", always=True),
               "after_generation": Hook("neighbor_mixing:attach_mixing_records", "in_place", always=True)},
    "igrpo": {"before": Hook("best_draft:condition_on_best_draft", "rows")},
    "rc_grpo": {"before": Hook("reward_tokens:condition_on_reward_tokens", "rows"),
                "after_stages": Hook("reward_tokens:mask_condition_tokens", "in_place", always=True)},
    "sage": {"before": Hook("self_hints:hint_by_level", "rows"),
             "after_generation": Hook("self_hints:reroll_with_hints", "pair")},
    "consistency_grpo": {"before": Hook("paraphrase_groups:assign_paraphrase_prompts", "rows")},
    "dapo_dynamic_sampling": {"after_generation": Hook("dapo_dynamic_sampling:refill_generation_batch", "pair")},
    "gcpo_ref": {"after_generation": Hook("reference_injection:inject_reference_solutions", "batch")},
    "lspo": {"after_generation": Hook("lspo_scaffold:scaffold_cliff_groups", "batch")},
    "soup": {"generate": Hook("soup_glue:generate_with_prefixes", "wrap"),
             "after_generation": Hook("soup_glue:mix_prefix_rollouts", "batch")},
    "pilot_commit": {"generate": Hook("pilot_commit_glue:generate_with_pilots", "wrap"),
                     "after_generation": Hook("pilot_commit_glue:reuse_pilot_rollouts", "batch")},
    "repo": {"append_rows": Hook("replay:append_replay_rows", "output")},
    "eframe": {"append_rows": Hook("eframe_glue:eframe_step", "batch")},
}


class GenerationHooks:
    """The hooks of one run's sampling variant (none for a plain filter or no sampling variant)."""

    def __init__(self, variant: Any) -> None:
        self.variant_id = getattr(variant, "id", None)
        self._hooks = {point: (hook.resolve(point), hook.always)
                       for point, hook in HOOKS.get(self.variant_id, {}).items()}

    def _get(self, point: str, training: bool) -> Callable[..., Any] | None:
        entry = self._hooks.get(point)
        return entry[0] if entry is not None and (training or entry[1]) else None

    def before(self, trainer: Any, inputs: list, training: bool) -> list:
        hook = self._get("before", training)
        return inputs if hook is None else hook(trainer, inputs)

    def after_generation(self, trainer: Any, inputs: list, output: dict, generate: Callable,
                         training: bool) -> tuple[list, dict]:
        hook = self._get("after_generation", training)
        return (inputs, output) if hook is None else hook(trainer, inputs, output, generate)

    def after_stages(self, trainer: Any, inputs: list, output: dict, training: bool) -> dict:
        hook = self._get("after_stages", training)
        return output if hook is None else hook(trainer, inputs, output)

    def generate(self, trainer: Any, generate: Callable, training: bool) -> Callable:
        """`generate` (TRL's `_generate_single_turn`, bound), wrapped by the variant's `generate` hook when it has
        one and this is a training batch's own generation."""
        hook = self._get("generate", training)
        return generate if hook is None else functools.partial(hook, trainer, generate)

    def append_rows(self, trainer: Any, inputs: list, output: dict, training: bool) -> dict:
        hook = self._get("append_rows", training)
        return output if hook is None else hook(trainer, inputs, output)
