"""SPO's prioritised prompt sampling (arXiv:2509.13232): each generation batch's prompts are drawn with probability
proportional to `√(p̂(1−p̂)) + 0.05`, `p̂` the prompt's value in the `spo_single` tracker.

Chosen through the prompt-selection seam (`prompt_sampler.py`). The rollout-filter function keeps every rollout;
the state the selection reads is `spo_single`'s tracker, which the advantage stage updates after each batch.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from ..advantages._prompt_keys import prompt_keys_from_ids
from ..advantages.spo_single import SPO_PRIOR_ALPHA, SPO_PRIOR_BETA, spo_tracker_lookup
from ..contracts import RolloutBatch
from ..registry import register
from .prompt_sampler import prompt_selection

VARIANT_ID = "spo_prioritized"
TRACKER_ID = "spo_single"
EXPLORATION_EPSILON = 0.05  # official EXPLORATION_EPSILON
UNSEEN_P_HAT = SPO_PRIOR_ALPHA / (SPO_PRIOR_ALPHA + SPO_PRIOR_BETA)  # 0.5: official offline_N = 0 prior


def _validate(config: Any) -> None:
    if config.advantage_estimator != TRACKER_ID:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} weights prompts by the spo_single value tracker: set "
                         f"advantage_estimator={TRACKER_ID!r} (got {config.advantage_estimator!r}).")


def spo_priority_weights(tracker: dict, keys: torch.Tensor) -> torch.Tensor:
    """`(M,)` float64 weights `√(p̂(1−p̂)) + 0.05` of the prompts with keys `keys (M,)`, `p̂ = α/(α+β)` from the
    spo_single `tracker` (its state: sorted `keys`, `values (α, β)`). A prompt the tracker has not scored gets
    `p̂ = 0.5`."""
    p_hat = torch.full((keys.numel(),), UNSEEN_P_HAT, dtype=torch.float64)
    if tracker.get("keys") is not None:
        ab, found = spo_tracker_lookup(tracker, keys)
        total = ab.sum(1)
        seen = found & (total > 0)
        p_hat[seen] = (ab[seen, 0] / total[seen]).clamp(0.0, 1.0)
    return (p_hat * (1.0 - p_hat)).sqrt() + EXPLORATION_EPSILON


def spo_priority_draw(weights: torch.Tensor, num_prompts: int, seed: int, draw: int) -> list[int]:
    """`num_prompts` distinct indices drawn with probability ∝ `weights`: successive weighted draws without
    replacement (`Generator.choice(replace=False, p=...)`), NumPy generator seeded `[seed, draw]` (the same on
    every process and after a resume, from the draw counter alone)."""
    w = weights.double().cpu().numpy()
    if num_prompts > w.size:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} draws {num_prompts} distinct prompts from a dataset of "
                         f"{w.size}.")
    rng = np.random.default_rng([int(seed), int(draw)])
    return rng.choice(w.size, size=num_prompts, replace=False, p=w / w.sum()).tolist()


def dataset_prompt_keys(trainer: Any, dataset: Any, chunk: int = 256) -> torch.Tensor:
    """`(M,)` int64 keys of every dataset prompt: tokenised by the trainer's `_tokenize_prompts` (as a generation
    batch is) and hashed by `prompt_keys_from_ids` (as the advantage stage hashes the batch's prompts)."""
    if getattr(trainer, "environment_factories", None) is not None:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} tokenises the dataset prompts ahead of generation, which "
                         "environment_factory runs (per-example tool schemas) do not support.")
    keys = []
    for start in range(0, len(dataset), chunk):
        prompts = [copy.deepcopy(dataset[i]["prompt"]) for i in range(start, min(start + chunk, len(dataset)))]
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        for ids in prompt_ids:
            row = torch.as_tensor(ids, dtype=torch.int64).view(1, -1)
            keys.append(prompt_keys_from_ids(row, torch.ones_like(row)))
    return torch.cat(keys)


@prompt_selection(VARIANT_ID)
def spo_prioritized_select(state: dict, num_prompts: int, dataset_size: int, trainer: Any = None, *,
                           seed: int) -> list[int]:
    """The prompts of the next generation batch, drawn ∝ SPO weight from the spo_single tracker, which already
    holds every scored batch. Computes the dataset prompts' keys on the first call (kept in `state`)."""
    if trainer is None:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} reads the trainer's spo_single tracker: the prompt-selection "
                         "seam must pass `trainer`.")
    state.setdefault("draws", 0)
    keys = state.get("dataset_keys")
    if keys is None or keys.numel() != dataset_size:
        keys = state["dataset_keys"] = dataset_prompt_keys(trainer, trainer._prompt_sampler.dataset)
    weights = spo_priority_weights(trainer.variant_state.get(TRACKER_ID, {}), keys)
    indices = spo_priority_draw(weights, num_prompts, seed, state["draws"])
    state["draws"] = int(state["draws"]) + 1
    return indices


@register(
    VARIANT_ID,
    name="SPO prioritised prompt sampling (Single-stream Policy Optimization)",
    paper="Single-stream Policy Optimization, arXiv:2509.13232",
    official_code="verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3:spo/spo_ray_trainer.py",
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "advantage_estimator": TRACKER_ID},
    stateful=True,
    validate=_validate,
)
def spo_prioritized(batch: RolloutBatch, *, state: dict) -> torch.Tensor:
    r"""SPO prioritised sampling: the prompts of each generation batch are drawn in proportion to how uncertain
    the spo_single tracker is about them; every generated rollout trains.

    Official: verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3:spo/spo_ray_trainer.py,
    `RaySPOTrainer.fit` l.379-432. Per prompt `p̂ = α/(α+β)` (l.383-385) and weight `w = √(p̂(1−p̂)) + 0.05`
    (`EXPLORATION_EPSILON`, l.381, 386-389); over the prompts of the dataloader's batch, `P = w / Σw` (l.401-409);
    `np.random.choice(M, size=train_batch_size, replace=train_batch_size > M, p=P)` (l.411-414), i.e. without
    replacement whenever the candidates suffice. The candidates are one dataloader batch of `gen_batch_size`
    prompts (spo/train.sh l.66: 14000 for the DAPO English subset, about the whole training set), the drawn batch
    `train_batch_size` = 1024 prompts (l.62). Every prompt has a tracker entry before training (offline pass,
    l.356-376; `α = β = 0.5`, `p̂ = 0.5`, when `offline_N = 0`, l.362-364).

    Here (`spo_prioritized_select`, through the prompt-selection seam, after batch `t` was scored and the tracker
    updated): `B = generation_batch_size / num_generations` distinct prompts drawn from the whole train dataset
    with `P ∝ w`, without replacement within the batch, with replacement across batches.

    **Choices**: the candidate pool is the whole dataset (official: a `gen_batch_size` window, which its script sets
    to about the whole set); a prompt the tracker has not scored yet gets `p̂ = 0.5`, weight 0.55 (the official
    offline_N = 0 value; with `spo_single_init="prior"` it is the tracker's own prior; with `"first_group"` the
    tracker has no value before the first visit); `p̂` is clipped to [0, 1] (non-binary rewards can move the
    tracker's running mean outside it; the official rewards are binary); the draw uses NumPy's
    `Generator.choice` seeded `[args.seed, draws]` (official: the global `np.random` state) so that every process
    draws the same prompts.

    Prompt keys: a dataset prompt is matched to its tracker entry by the key the advantage stage gives it
    (`prompt_keys_from_ids` on the prompt tokens); the dataset's keys are computed once, on the first selection,
    with the trainer's `_tokenize_prompts`, and kept in the state.

    Shapes: `batch.rewards (N,)` → keep `(N,)`, all `True`. State: `draws` (draws made; seeds the next one),
    `dataset_keys (M,)` int64, `pending` (the seam's record of the batch's prompts; unused here, cleared). Saved
    with every checkpoint. Valid only with `advantage_estimator="spo_single"` (the tracker).

    Args:
        batch (`RolloutBatch`): the global generation batch.
        state (`dict`): see above.

    Returns:
        `torch.Tensor`: `(N,)` bool, all `True`.
    """
    state["pending"] = torch.zeros(0, dtype=torch.int64)
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
