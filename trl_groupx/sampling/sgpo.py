"""sGPO (sorted Group Policy Optimization): one offline profiling pass under the initial policy gives each training
prompt's success rate p̂; trivial prompts (p̂ = 1) are removed, unsolvable ones (p̂ = 0) sub-sampled, and the rest
are trained on from easy to hard (decreasing p̂).

The curriculum is served through the prompt-selection seam (`prompt_sampler.py`): the profiling pass runs at the
first training generation (the policy is still the initial one, prepared exactly as for TRL's own generation), its
result lives in the variant's state, and every generation batch takes the next prompts of the sorted list. The
variant's rollout-filter function keeps every rollout.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch

from ..contracts import RolloutBatch
from ..registry import register
from ._scoring import score_aside
from .baseline_rollouts import generate_aside
from .group_layout import check_variable_groups
from .prompt_sampler import prompt_selection

VARIANT_ID = "sgpo"
ORDERS = ("easy_to_hard", "hard_to_easy", "shuffled")
GROUP_SIZE_RULES = ("inverse_success", "fixed")
MIN_GROUP_SIZE = 2  # a group of one rollout has advantage 0


def _validate(config: Any) -> None:
    n = config.sgpo_profile_samples
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"sgpo_profile_samples={n!r}: use an integer ≥ 2 (profiling completions per prompt; with one "
                         "sample every prompt looks trivial or unsolvable). Default 4.")
    keep = config.sgpo_unsolvable_keep
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 <= keep <= 1.0:
        raise ValueError(f"sgpo_unsolvable_keep={keep!r}: use a fraction in [0, 1] of the never-solved prompts to "
                         "keep (default 0.1; 0 drops them all).")
    t = config.sgpo_success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"sgpo_success_threshold={t!r}: use a finite reward above which a profiling completion "
                         "counts as a success (0.5 for 0/1 accuracy rewards).")
    if config.sgpo_order not in ORDERS:
        raise ValueError(f"sgpo_order={config.sgpo_order!r}: use one of {ORDERS} ('easy_to_hard' is the paper's "
                         "curriculum).")
    if config.sgpo_group_size not in GROUP_SIZE_RULES:
        raise ValueError(f"sgpo_group_size={config.sgpo_group_size!r}: use one of {GROUP_SIZE_RULES} "
                         "('inverse_success' is the paper's G = 1/p̂; 'fixed' gives every prompt num_generations).")
    cap = config.sgpo_max_group_size
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < MIN_GROUP_SIZE):
        raise ValueError(f"sgpo_max_group_size={cap!r}: use an integer ≥ {MIN_GROUP_SIZE} (the group size of the "
                         "hardest prompts), or None for num_generations.")
    if cap is not None and config.sgpo_group_size == "fixed":
        raise ValueError("sgpo_max_group_size only caps sgpo_group_size='inverse_success'; with 'fixed' every group "
                         "has num_generations rollouts. Drop sgpo_max_group_size.")
    if config.sgpo_group_size == "inverse_success":
        check_variable_groups(config, "sgpo_group_size='inverse_success'")
    if getattr(config, "use_vllm", False):
        raise ValueError("rollout_filter='sgpo' profiles the prompts with the trainer's transformers generator; it "
                         "does not run with use_vllm=True yet. Set use_vllm=False.")


def success_rates(rewards: torch.Tensor, threshold: float, variant_id: str = VARIANT_ID) -> torch.Tensor:
    """`p̂ (M,)` float64 from profiling rewards `(M, S)`: successes (`reward > threshold`) over scored samples (a NaN
    reward, every reward function returned None, is no sample); NaN for a prompt with no scored sample."""
    rewards = rewards.double()
    if torch.isinf(rewards).any():
        raise ValueError(f"rollout_filter={variant_id!r}: a profiling completion got an infinite reward; check the "
                         "reward functions.")
    scored = ~torch.isnan(rewards)
    trials = scored.sum(1)
    successes = ((rewards > threshold) & scored).sum(1)
    return torch.where(trials > 0, successes.double() / trials.clamp(min=1), torch.full_like(trials, math.nan,
                                                                                             dtype=torch.float64))


def sgpo_curriculum(p_hat: torch.Tensor, unsolvable_keep: float, order: str, seed: int) -> list[int]:
    """The kept prompts, in training order, from the profiled success rates `p_hat (M,)`.

    - removed: `p̂ = 1` (trivial) and `p̂ = NaN` (no reward function scored any profiling completion);
    - unsolvable (`p̂ = 0`): `⌊f · n₀ + 1/2⌋` of the `n₀` kept, `f = unsolvable_keep`, the first of a NumPy
      permutation seeded `[seed]` of their indices (same on every process and after a resume);
    - `0 < p̂ < 1`: all kept;
    - order: `easy_to_hard` by decreasing p̂ (kept unsolvable last), `hard_to_easy` by increasing p̂, ties by dataset
      index; `shuffled`: a NumPy permutation seeded `[seed, 1]` of the kept indices.

    Raises when nothing is kept (every prompt trivial, or unsolvable with `f` too small)."""
    p = p_hat.double()
    index = torch.arange(p.numel())
    unsolvable = index[p == 0.0]
    middle = index[(p > 0.0) & (p < 1.0)]
    n_keep = math.floor(unsolvable_keep * unsolvable.numel() + 0.5)
    if n_keep:
        draw = np.random.default_rng([int(seed)]).permutation(unsolvable.numel())[:n_keep]
        unsolvable = unsolvable[torch.from_numpy(np.sort(draw))]
    else:
        unsolvable = unsolvable[:0]
    kept = torch.cat([middle, unsolvable]).sort().values
    if kept.numel() == 0:
        trivial, nan = int((p == 1.0).sum()), int(torch.isnan(p).sum())
        raise ValueError(f"rollout_filter='sgpo': the profiling pass leaves no prompt to train on ({trivial} of "
                         f"{p.numel()} solved by every profiling sample, {int((p == 0.0).sum())} by none, {nan} "
                         "unscored): use harder prompts, raise sgpo_unsolvable_keep, sgpo_profile_samples or "
                         "sgpo_success_threshold.")
    if order == "shuffled":
        return kept[torch.from_numpy(np.random.default_rng([int(seed), 1]).permutation(kept.numel()))].tolist()
    key = -p[kept] if order == "easy_to_hard" else p[kept]
    return kept[torch.sort(key, stable=True).indices].tolist()  # stable: ties keep ascending dataset index


def profile_success_rates(trainer: Any, dataset: Any, samples: int, threshold: float,
                          variant_id: str = VARIANT_ID) -> torch.Tensor:
    """`p̂ (M,)` of every dataset prompt: `samples` completions each from TRL's generator (the current policy at the
    run's sampling settings), scored by the run's reward functions (weighted sum, as for rollouts).

    Sharded: each generation round covers `P · C` consecutive prompts, process `p` generating for prompts
    `p·C … p·C + C − 1` of the round (`C` prompts × `samples` rows, about one local generation batch), the last
    round padded with the last prompt (discarded). `score_aside` gathers the rewards in process order, i.e. in
    prompt order, so every process ends with the same `p̂`; every process makes the same generate and reward calls.
    """
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"rollout_filter={variant_id!r} profiles prompts with the trainer's own single-turn "
                         "generator; it cannot reproduce a rollout_func, tools or environments. Drop them, or use "
                         "another rollout_filter.")
    acc = trainer.accelerator
    num_processes, rank = acc.num_processes, acc.process_index
    size = len(dataset)
    per_process = max(1, trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation // samples)
    block = num_processes * per_process
    rewards = torch.full((size, samples), math.nan, dtype=torch.float64)
    for start in range(0, size, block):
        mine = [min(start + rank * per_process + c, size - 1) for c in range(per_process)]
        rows = [dataset[i] for i in mine for _ in range(samples)]
        prompt_ids, images, multimodal_fields = trainer._tokenize_prompts([copy.deepcopy(r["prompt"]) for r in rows])
        if images is not None or multimodal_fields:
            raise ValueError(f"rollout_filter={variant_id!r} profiles text prompts only.")
        completion_ids = generate_aside(trainer, prompt_ids, samples)
        per_func = score_aside(trainer, rows, completion_ids).double().cpu()  # (P · C · S, K), process order
        weighted = (per_func * trainer.reward_weights.double().cpu()).nansum(dim=1)
        weighted[torch.isnan(per_func).all(dim=1)] = math.nan
        slots = torch.arange(start, start + block)
        valid = slots < size
        rewards[slots[valid]] = weighted.view(block, samples)[valid]
    return success_rates(rewards, threshold, variant_id)


def inverse_success_group_sizes(p_hat: torch.Tensor, max_size: int) -> torch.Tensor:
    """`(M,)` int64 group sizes `G_x = min(max(⌈1/p̂_x⌉, 2), max_size)` (`G_x = max_size` for `p̂_x = 0`; NaN, a
    dropped prompt, gets `max_size` too). p̂ = .25 → 4, .5 → 2, .75 → ⌈1.33⌉ = 2, 1/3 → 3 (the ceiling is taken
    of `1/p̂ − 1e−9`, so that a float reciprocal just above an integer does not round up)."""
    p = p_hat.double()
    inverse = torch.where(p > 0, torch.ceil(1.0 / p.clamp(min=1e-12) - 1e-9), torch.full_like(p, float(max_size)))
    inverse = torch.nan_to_num(inverse, nan=float(max_size))
    return inverse.clamp(min=MIN_GROUP_SIZE, max=max_size).to(torch.int64)


def fill_row_budget(order: torch.Tensor, sizes: torch.Tensor, served: int, num_rows: int) -> tuple[list[int],
                                                                                                    list[int]]:
    """The groups of one generation batch of `num_rows` rows: curriculum positions `served, served + 1, …` (modulo
    `K = len(order)`), prompt `x` taking `sizes[x]` rows, until the budget is spent. Returns `(prompts, group sizes)`.

    **Choice** for the last group, which rarely fits exactly: with `r < sizes[x]` rows left, prompt `x` gets a group
    of `r` rows when `r ≥ 2`; when `r = 1` the row goes to the previous group (which may then exceed the cap by one)
    and `x` waits for the next batch. A curriculum shorter than a batch wraps, so a prompt can own two groups of one
    batch (they are normalised separately)."""
    if num_rows < MIN_GROUP_SIZE:
        raise ValueError(f"rollout_filter='sgpo' with variable group sizes needs generation batches of at least "
                         f"{MIN_GROUP_SIZE} rows, got {num_rows}.")
    prompts: list[int] = []
    group_sizes: list[int] = []
    remaining, position = num_rows, served
    while remaining:
        x = int(order[position % order.numel()])
        size = int(sizes[x])
        if remaining == 1:
            group_sizes[-1] += 1
            break
        prompts.append(x)
        group_sizes.append(min(size, remaining))
        remaining -= group_sizes[-1]
        position += 1
    return prompts, group_sizes


@prompt_selection(VARIANT_ID)
def sgpo_select(state: dict, num_prompts: int, dataset_size: int, trainer: Any = None, *, seed: int,
                sgpo_profile_samples: int, sgpo_success_threshold: float, sgpo_unsolvable_keep: float,
                sgpo_order: str, sgpo_group_size: str = "fixed", sgpo_max_group_size: int | None = None,
                num_generations: int = 2) -> list[int] | tuple[list[int], list[int]]:
    """The prompts of the next generation batch, wrapping to the curriculum's start when it is exhausted: the next
    `num_prompts` of the curriculum (`sgpo_group_size="fixed"`), or as many as fill `num_prompts × num_generations`
    rows with groups of `inverse_success_group_sizes` (`"inverse_success"`; returns `(prompts, sizes)`). Profiles the
    dataset and builds the curriculum on the first call (state empty)."""
    if "order" not in state:
        if trainer is None:
            raise ValueError("rollout_filter='sgpo' profiles the train dataset: the seam must pass `trainer`.")
        p_hat = profile_success_rates(trainer, trainer.train_dataset, sgpo_profile_samples, sgpo_success_threshold)
        order = sgpo_curriculum(p_hat, sgpo_unsolvable_keep, sgpo_order, seed)
        state.update(p_hat=p_hat, order=torch.tensor(order, dtype=torch.int64), served=0)
        metrics = trainer._metrics["train"]
        metrics["groupx/sgpo_kept_fraction"].append(len(order) / dataset_size)
        metrics["groupx/sgpo_trivial_fraction"].append(float((p_hat == 1.0).double().mean()))
        metrics["groupx/sgpo_unsolvable_fraction"].append(float((p_hat == 0.0).double().mean()))
    order = state["order"]
    if state["p_hat"].numel() != dataset_size:
        raise ValueError(f"rollout_filter='sgpo' profiled {state['p_hat'].numel()} prompts but the train dataset has "
                         f"{dataset_size}; resume with the dataset the checkpoint was trained on.")
    if sgpo_group_size == "inverse_success":
        cap = num_generations if sgpo_max_group_size is None else sgpo_max_group_size
        sizes = inverse_success_group_sizes(state["p_hat"], cap)
        chosen, group_sizes = fill_row_budget(order, sizes, int(state["served"]), num_prompts * num_generations)
        state["served"] = int(state["served"]) + len(chosen)
        if trainer is not None:
            trainer._metrics["train"]["groupx/sgpo_batch_profile_success"].append(
                float(state["p_hat"][chosen].mean()))
        return chosen, group_sizes
    if order.numel() < num_prompts:
        raise ValueError(f"rollout_filter='sgpo' kept {order.numel()} prompts after profiling but a generation batch "
                         f"needs {num_prompts} distinct ones: raise sgpo_unsolvable_keep, use a larger dataset, or a "
                         "smaller generation_batch_size.")
    served = int(state["served"])
    chosen = [int(order[(served + j) % order.numel()]) for j in range(num_prompts)]
    state["served"] = served + num_prompts
    if trainer is not None:
        trainer._metrics["train"]["groupx/sgpo_batch_profile_success"].append(
            float(state["p_hat"][chosen].mean()))
    return chosen


@register(
    VARIANT_ID,
    name="sGPO (sorted Group Policy Optimization)",
    paper="sGPO: Trading Inference FLOPs for Training Efficiency in RLVR, arXiv:2606.08854",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "sgpo_profile_samples": 4, "sgpo_success_threshold": 0.5,
           "sgpo_unsolvable_keep": 0.1, "sgpo_order": "easy_to_hard", "sgpo_group_size": "inverse_success",
           "sgpo_max_group_size": None},
    params=("sgpo_profile_samples", "sgpo_success_threshold", "sgpo_unsolvable_keep", "sgpo_order",
            "sgpo_group_size", "sgpo_max_group_size"),
    stateful=True,
    validate=_validate,
)
def sgpo(batch: RolloutBatch, *, state: dict) -> torch.Tensor:
    r"""sGPO: train on the profiled prompts, trivial ones removed, unsolvable ones sub-sampled, easy → hard.

    Source: the paper's abstract (arXiv:2606.08854; no official code): "generating a small batch of parallel samples
    per query under the initial policy" gives an empirical success rate p̂, which drives data filtering ("removing
    trivial queries and sub-sampling unsolvable ones"), a training group size `G ∝ 1/p̂` and a curriculum "from
    easy to hard". The method section was not retrievable here; every number below is **our choice**.

    - Profiling (`profile_success_rates`, once, at the first training generation, i.e. under the initial policy):
      `S = sgpo_profile_samples` completions per dataset prompt from TRL's own generator at the run's sampling
      settings, scored by the run's reward functions (weighted sum); `p̂_x = #{r > sgpo_success_threshold} / #scored`.
      The prompts are sharded over the processes and the rewards gathered, so every process holds the same p̂.
      **Choice**: S = 4 (paper value not found), threshold 0.5 with a strict `>`.
    - Filtering and order (`sgpo_curriculum`): drop `p̂ = 1`; keep `⌊f·n₀ + ½⌋` of the `n₀` prompts with `p̂ = 0`
      (`f = sgpo_unsolvable_keep`, **choice** 0.1), drawn with the run's seed; keep every `0 < p̂ < 1`; sort by
      decreasing p̂ (`sgpo_order="easy_to_hard"`; `"hard_to_easy"` and `"shuffled"` are ablations). A prompt no
      reward function scored (all NaN) is dropped (**choice**: it would train at advantage 0).
    - Serving (`sgpo_select`, through the prompt-selection seam): with fixed groups, generation batch `t` takes
      curriculum positions `t·B … t·B + B − 1` modulo the curriculum length `K` (`B = generation_batch_size /
      num_generations`; with variable groups, the next prompts whose groups fill the batch's rows): after
      the hardest prompt the curriculum restarts from the easiest (**choice**). The trainer's epoch length stays
      `len(dataset) // B` generation batches (HF sizes the dataloader before profiling); set `max_steps` to train
      on the reduced set only.
    - Group size (`sgpo_group_size="inverse_success"`, the paper's rule "setting the training rollout group size to
      the inverse of this success rate"): prompt x gets `G_x = ⌈1/p̂_x⌉` rollouts (p̂ = .25 → 4), at least 2 (a
      one-rollout group has no advantage; **choice**) and at most `sgpo_max_group_size` (default `num_generations`;
      prompts with p̂ = 0 get the cap; **choice**, the paper's cap was not retrievable). TRL's row budget is kept:
      a generation batch has `generation_batch_size` rows, filled in curriculum order with whole groups
      (`fill_row_budget`; the last group is cut to the rows left, **choice**), so the number of prompts per batch
      varies. Advantages are GRPO's within each group (`sampling/group_layout.py`); advantage estimators,
      token-weight variants and group-reading objectives are refused at config time. `sgpo_group_size="fixed"`
      gives every prompt `num_generations` rollouts (`num_generations` per prompt, `B` prompts per batch).

    Shapes: `batch.rewards (N,)` → keep `(N,)`, all `True` (no rollout is dropped). Evaluation is untouched.

    State (saved with every checkpoint, so a resumed run neither re-profiles nor moves in the curriculum): `p_hat`
    `(M,)` float64 (NaN = unscored), `order` `(K,)` int64 dataset indices in training order, `served` (prompts
    handed out so far), `pending` `(B,)` the prompts of the batch being scored and, with variable groups,
    `pending_sizes` their group sizes (both cleared here).

    Args:
        batch (`RolloutBatch`): the global generation batch.
        state (`dict`): the curriculum (see above).

    Returns:
        `torch.Tensor`: `(N,)` bool, all `True`.
    """
    pending = state.get("pending")
    if batch.group_sizes is not None:
        sizes = state.get("pending_sizes")
        if sizes is None or not torch.equal(sizes.cpu(), batch.group_sizes.cpu()) or (
                batch.rewards.shape[0] != int(sizes.sum())):
            raise ValueError(f"rollout_filter='sgpo': {batch.rewards.shape[0]} rollouts in groups "
                             f"{batch.group_sizes.tolist()}, but the selection recorded "
                             f"{None if sizes is None else sizes.tolist()}.")
    elif pending is not None and pending.numel() and batch.rewards.shape[0] != pending.numel() * batch.group_size:
        raise ValueError(f"rollout_filter='sgpo': {batch.rewards.shape[0]} rollouts for {pending.numel()} selected "
                         f"prompts of {batch.group_size} rollouts each.")
    state["pending"] = torch.zeros(0, dtype=torch.int64)
    state.pop("pending_sizes", None)
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
