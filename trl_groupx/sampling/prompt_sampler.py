"""The prompt-selection seam: a sampling-stage variant chooses which dataset prompts form each generation batch.

TRL's `RepeatSampler` fixes the prompts of every generation batch in advance (a seeded permutation). A
prompt-selection variant instead picks the prompts of batch `t + 1` from a state it updated with the rewards of
batches `≤ t` (VADE's Beta posteriors). Such a variant is registered twice: as a rollout filter
(`rollout_filter=<id>`, stateful: its function keeps every rollout and folds the batch's global rewards into its
state) and here, with `@prompt_selection(<id>)`, as the function that picks the next batch's prompts from that
state.

When the decision is made. The dataloader cannot carry it: whatever the sampler yields is fetched ahead of
training. `transformers.Trainer` pulls a whole optimizer step's `gradient_accumulation_steps` batches before the
first of them is trained on (`get_batch_samples`), and accelerate's `DataLoaderShard` fetches one batch beyond the
one it hands out (to detect the end of the loader); with TRL's default `steps_per_generation =
gradient_accumulation_steps` the first batch of generation batch `t + 1` is therefore fetched before batch `t` is
generated, let alone scored. So the decision is deferred to the moment of generation:

- `_get_train_sampler` returns a `PromptSelectionSampler`: same length and batch layout as TRL's sampler, but its
  indices are placeholders that only drive the training loop's clock (their rows are fetched and discarded).
- `GRPOTrainer._prepare_inputs`, on the calls where TRL generates (`_step % (steps_per_generation ×
  num_iterations) == 0`, or nothing buffered after a resume), replaces the placeholder rows by
  `PromptSelectionSampler.generation_rows`: the variant's selection on the current state (which already holds
  every scored batch, the previous one included), this process's slice of the global rows. The selection reads
  only the state (posteriors, a draw counter) and the config, so every process computes the same global prompt
  list and takes its own slice: process `p` gets rows `p·L … (p+1)·L − 1` of the global list, exactly as
  accelerate would shard TRL's sampler.
- The chosen global prompt indices are recorded in `state["pending"]` (one per group, in global row order: prompt
  `j` owns rows `j·G … j·G + G − 1` of the gathered rewards); the variant's rollout-filter call on that batch
  consumes them.

Checkpoints and resume: the state (posteriors, draw counter) is the variant's `variant_state` entry, saved with
every checkpoint and restored before training resumes. HF's resume replays the skipped batches of the epoch through
the sampler; here they are placeholders, so the replay has no effect on the selection. TRL regenerates on the first
batch after a resume (`_buffered_inputs is None`), which is where the resumed run asks the restored state for the
next batch: a run resumed at a generation-batch boundary (always the case when `steps_per_generation ×
num_iterations` divides `gradient_accumulation_steps × save_steps`, e.g. TRL's defaults) continues exactly. Resumed
inside a generation batch, TRL regenerates the remaining slices and this seam selects a new batch for them (plain
TRL also regenerates there, with the prompts its sampler had fixed).

Evaluation is untouched (TRL's eval sampler; the rollout-filter call works on a copy of the state).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from .group_layout import GroupLayout

PromptSelectionFn = Callable[..., list[int]]
_SELECTIONS: dict[str, PromptSelectionFn] = {}
_ACTIVE_WHEN: dict[str, Callable[[Any], bool]] = {}


def prompt_selection(variant_id: str, when: Callable[[Any], bool] | None = None
                     ) -> Callable[[PromptSelectionFn], PromptSelectionFn]:
    """Register `fn(state, num_prompts, dataset_size, *, seed, <config fields>) -> list[int]` as the prompt
    selection of rollout-filter variant `variant_id`. A selection that sizes each prompt's group returns
    `(indices, sizes)` instead: `Σ sizes = num_prompts × num_generations` rows, any number of prompts
    (`group_layout.py`). `fn` initialises `state` when empty and may update it (draw
    counters); it must depend on nothing but its arguments, so that every process selects the same prompts.
    `when(config)`: the selection applies only when it is true (a variant that keeps TRL's sampler unless a flag asks
    for its own group sizes, S2L-PO); by default always."""

    def decorator(fn: PromptSelectionFn) -> PromptSelectionFn:
        if variant_id in _SELECTIONS:
            raise ValueError(f"A prompt selection is already registered for {variant_id!r}.")
        _SELECTIONS[variant_id] = fn
        if when is not None:
            _ACTIVE_WHEN[variant_id] = when
        return fn

    return decorator


def selection_for(variant_id: str | None, config: Any = None) -> PromptSelectionFn | None:
    """The prompt selection of a sampling variant, or `None` when it selects no prompts (or, given the run's
    `config`, not under its flags)."""
    fn = _SELECTIONS.get(variant_id) if variant_id is not None else None
    if fn is not None and config is not None and not _ACTIVE_WHEN.get(variant_id, lambda _: True)(config):
        return None
    return fn


class PromptSelectionSampler(Sampler[int]):
    """Training sampler of a prompt-selection variant (see the module docstring).

    Iterating yields placeholder indices with the layout of TRL's `RepeatSampler` (`prompts_per_batch` prompts per
    global generation batch, each `num_generations` times, the batch `repeat_count` times); `generation_rows`
    makes the real choice at generation time.
    """

    def __init__(self, trainer: Any, dataset: Any, selection: PromptSelectionFn, variant_id: str) -> None:
        self.trainer, self.dataset, self.selection, self.variant_id = trainer, dataset, selection, variant_id
        args = trainer.args
        self.num_generations = trainer.num_generations
        self.prompts_per_batch = args.generation_batch_size // trainer.num_generations
        self.repeat_count = trainer.num_iterations * args.steps_per_generation
        self.dataset_size = len(dataset)
        self.layout: GroupLayout | None = None  # group sizes of the last selection, None when all are G
        if self.prompts_per_batch > self.dataset_size:
            raise ValueError(
                f"rollout_filter={variant_id!r} selects {self.prompts_per_batch} distinct prompts per generation batch "
                f"(generation_batch_size // num_generations) but the dataset has {self.dataset_size}; use a larger "
                "dataset or a smaller per_device_train_batch_size × steps_per_generation."
            )

    def __len__(self) -> int:
        batches = self.dataset_size // self.prompts_per_batch
        return batches * self.prompts_per_batch * self.num_generations * self.repeat_count

    def __iter__(self) -> Iterator[int]:
        # Placeholders: cheap valid indices in TRL's layout; `generation_rows` replaces their rows.
        for start in range(0, self.dataset_size - self.prompts_per_batch + 1, self.prompts_per_batch):
            for _ in range(self.repeat_count):
                for index in range(start, start + self.prompts_per_batch):
                    yield from [index] * self.num_generations

    def select(self) -> list[int]:
        """Global prompt indices of the next generation batch, from the variant's current state (recorded in
        `state["pending"]` for the variant's update)."""
        trainer = self.trainer
        state = trainer.variant_state[self.variant_id]
        from ..contracts import config_kwargs

        kwargs = config_kwargs(self.selection, trainer.args)
        if "trainer" in inspect.signature(self.selection).parameters:  # it reads other variants' state (spo_prioritized)
            kwargs["trainer"] = trainer
        selected = self.selection(state, self.prompts_per_batch, self.dataset_size, **kwargs)  # `seed`: args.seed
        self.layout = None
        if isinstance(selected, tuple):  # (indices, group sizes): variable groups (group_layout.py)
            indices, sizes = selected
            self.layout = GroupLayout.from_sizes(sizes, self.prompts_per_batch * self.num_generations,
                                                 f"rollout_filter={self.variant_id!r}")
            expected = self.layout.sizes.numel()
        else:
            indices, expected = selected, self.prompts_per_batch
        if len(indices) != expected or not all(0 <= i < self.dataset_size for i in indices):
            raise RuntimeError(f"{self.variant_id}: the selection returned {indices}, expected "
                               f"{expected} indices in [0, {self.dataset_size}).")
        state["pending"] = torch.tensor(indices, dtype=torch.int64)
        if self.layout is not None:
            state["pending_sizes"] = self.layout.sizes.clone()
        return list(indices)

    def generation_rows(self, local_batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """This process's rows of the next generation batch (same length as the placeholder `local_batch`)."""
        indices = self.select()
        local_n = len(local_batch)
        start = self.trainer.accelerator.process_index * local_n
        sizes = [self.num_generations] * len(indices) if self.layout is None else self.layout.sizes.tolist()
        global_rows = [i for i, size in zip(indices, sizes) for _ in range(size)]
        if len(global_rows) != local_n * self.trainer.accelerator.num_processes:
            raise RuntimeError(f"{self.variant_id}: {len(global_rows)} selected rows for a generation batch of "
                               f"{local_n} rows × {self.trainer.accelerator.num_processes} processes.")
        return [self.dataset[i] for i in global_rows[start : start + local_n]]


def pending_outcomes(batch: Any, state: dict, variant_id: str, threshold: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`(pending (B,), successes (B,), trials (B,))` of the selected prompts of the batch being scored (`None` when
    the sampler chose none: an evaluation copy, a batch before the first selection). A trial is a scored rollout (a
    NaN reward is none), a success a trial with reward `≥ threshold`. Prompt `j` owns the `j`-th group: `G` rows, or
    `pending_sizes[j]` with variable groups. Raises when the rows do not match the recorded prompts."""
    pending = state.get("pending")
    if pending is None or pending.numel() == 0:
        return None
    rewards = batch.rewards.detach().cpu().double()
    sizes = [batch.group_size] * pending.numel() if batch.group_sizes is None else batch.group_sizes.tolist()
    if len(sizes) != pending.numel() or rewards.shape[0] != sum(sizes):
        raise ValueError(f"rollout_filter={variant_id!r}: {rewards.shape[0]} rollouts for {pending.numel()} selected "
                         f"prompts of {batch.group_size if batch.group_sizes is None else sizes} rollouts each.")
    scored = [~torch.isnan(g) for g in torch.split(rewards, sizes)]
    successes = torch.stack([((g >= threshold) & s).sum() for g, s in zip(torch.split(rewards, sizes), scored)])
    return pending, successes, torch.stack([s.sum() for s in scored])


def build_train_sampler(trainer: Any, dataset: Any, default: Callable[[Any], Sampler]) -> Sampler:
    """`_get_train_sampler`: a `PromptSelectionSampler` when the run's sampling variant selects prompts, else
    `default(dataset)` (TRL's `RepeatSampler`)."""
    variant = getattr(trainer, "variants", {}).get("sampling")
    selection = selection_for(getattr(variant, "id", None), trainer.args)
    if selection is None:
        trainer._prompt_sampler = None
        return default(dataset)
    dataset = trainer.train_dataset if dataset is None else dataset
    trainer._prompt_sampler = PromptSelectionSampler(trainer, dataset, selection, variant.id)
    return trainer._prompt_sampler


def resolve_generation_batch(trainer: Any, generation_batch: Any) -> Any:
    """`_prepare_inputs`: on the calls where TRL is about to generate a training batch, the selected rows replace
    the placeholder rows; otherwise `generation_batch` unchanged."""
    variant = getattr(trainer, "variants", {}).get("sampling")
    if not trainer.model.training or selection_for(getattr(variant, "id", None), trainer.args) is None:
        return generation_batch
    sampler = getattr(trainer, "_prompt_sampler", None)
    if sampler is None:
        raise ValueError(
            f"rollout_filter={variant.id!r} selects prompts by dataset index, which needs a map-style train_dataset "
            "(a datasets.Dataset, not an IterableDataset) and the trainer's own train dataloader."
        )
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    if trainer._step % generate_every == 0 or trainer._buffered_inputs is None:  # TRL generates on this call
        return sampler.generation_rows(generation_batch)
    return generation_batch
