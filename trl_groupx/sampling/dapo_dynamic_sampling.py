"""DAPO dynamic sampling WITH refill: drop zero-variance groups and generate new prompts until the batch is full."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register
from .zero_variance_filter import zero_variance_filter

logger = logging.getLogger(__name__)

VARIANT_ID = "dapo_dynamic_sampling"
_OFFICIAL = "volcengine/verl@9d7720026a1edf52e6dfd88170c79339e8b27ef7:recipe/dapo/dapo_ray_trainer.py"

# Output keys of TRL 1.16's `_generate_and_score_completions` that the merge knows how to concatenate, with their
# padding side and the pad value (None: the tokenizer's pad token id). Multimodal keys are refused.
LEFT_PADDED: dict[str, float | None] = {"prompt_ids": None, "prompt_mask": 0}
RIGHT_PADDED: dict[str, float | None] = {
    "completion_ids": None,
    "completion_mask": 0,
    "tool_mask": 1,  # TRL pads tool_mask with 1 (masked by completion_mask anyway)
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 0.0,  # (B, T) token modes or (B, 1) sequence modes: padded to its pieces' width
}
ROW_KEYS = ("advantages",)  # (B,) or (B, T) with T padded like completions
SKIPPED_KEYS = ("num_items_in_batch",)  # recomputed after the merge


def validate(config: Any) -> None:
    if config.dapo_max_gen_batches < 0:
        raise ValueError(
            f"dapo_max_gen_batches={config.dapo_max_gen_batches}: use a positive cap on generation batches per "
            "training batch, or 0 for no cap (DAPO's verl script: 10)."
        )
    local = config.per_device_train_batch_size * config.steps_per_generation
    if local % config.num_generations != 0:
        raise ValueError(
            f"rollout_filter='dapo_dynamic_sampling' refills whole groups on each process, so "
            f"per_device_train_batch_size × steps_per_generation ({config.per_device_train_batch_size} × "
            f"{config.steps_per_generation} = {local}) must be a multiple of num_generations "
            f"({config.num_generations}); change per_device_train_batch_size, steps_per_generation (or "
            "gradient_accumulation_steps) or num_generations."
        )


@register(
    VARIANT_ID,
    name="DAPO dynamic sampling (zero-variance group filter with refill)",
    paper="DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv:2503.14476",
    official_code=_OFFICIAL,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "dapo_max_gen_batches": 10},
    params=("dapo_max_gen_batches",),
    stateful=True,
    validate=validate,
)
def dapo_dynamic_sampling(batch: RolloutBatch, *, dapo_max_gen_batches: int = 10, state: dict) -> torch.Tensor:
    r"""DAPO dynamic sampling (paper §3.2; the constraint `0 < |{o_i : is_equivalent(a, o_i)}| < G` of its objective).

    Per training batch: generate a batch of groups, keep the groups whose rewards are not all equal, and while fewer
    than the batch's number of groups are kept, generate another batch of NEW prompts (up to `dapo_max_gen_batches`
    generation batches in all; 0 = no cap), concatenating the kept groups in generation order; then truncate to
    exactly the batch size. The refill loop runs in the trainer (`refill_generation_batch`, called from
    `GRPOTrainer._generate_and_score_completions` right after TRL's generation and scoring, before the other
    stages); this function is the stage's filter on the merged batch, the zero-variance test of
    `zero_variance_filter`: `keep_i = [max_{j∈g(i), scored} r_j > min_{j∈g(i), scored} r_j]`, `(N,)` → `(N,)` bool.
    After a successful refill it keeps every group; it only drops the zero-variance groups that fill the batch when
    the cap was hit (completion mask 0, advantage 0, out of `num_items_in_batch`, like the filter without refill).

    Reference: volcengine/verl@9d7720026a1edf52e6dfd88170c79339e8b27ef7:recipe/dapo/dapo_ray_trainer.py,
    `RayDAPOTrainer.fit`: l.132-133 and l.147-148 (`num_gen_batches` counts generation batches), l.229-268 (keep a
    prompt's trajectories iff `np.std(metric) > 0` or it has one trajectory; concatenate with the kept ones so
    far), l.270-288 (while `num_prompt_in_batch < train_batch_size`: generate the next batch unless
    `num_gen_batches >= max_num_gen_batches > 0`, which raises; else truncate to `train_batch_size × n`),
    l.392-395 (metric `train/num_gen_batches`, counters reset). Defaults from the DAPO script
    recipe/dapo/run_dapo_qwen2.5_32b.sh l.25-30 at the same commit (`max_num_gen_batches=10`, `n=16`).

    Choices and differences from verl (the paper gives no more detail than "over-sample and filter out ... until
    the batch is fully filled"):

    - Cap: verl raises when `max_num_gen_batches` is reached. Here training continues: the missing groups are
      filled with the earliest dropped (zero-variance) groups, which this filter then neutralises, so the step
      trains on fewer groups (logged as `groupx/kept_fraction` < 1 and `groupx/dapo_kept_groups`).
    - Per process: each process fills its own slots from its own generations (groups never move between
      processes); every process runs the same number of rounds, decided from the gathered rewards, which are
      identical on all ranks, so no extra collective is needed; a full process still generates (TRL's
      generation and scoring gather across processes) and discards. verl collects kept groups globally.
    - Refill prompts: each round generates one full local generation batch
      (`per_device_train_batch_size × steps_per_generation / num_generations` new prompts per process) drawn from
      a refill source of our own, not from TRL's dataloader (which fixes the prompts of each step before
      generation): a permutation of `train_dataset` per refill epoch, `torch.randperm` with a generator seeded
      `args.seed + 104729 · (epoch + 1)` (offset so that it differs from TRL's sampler, which is seeded
      `args.seed`); round prompts are the next `P × groups_per_process` indices, process `p` takes slice `p`.
      Its position (`state = {"epoch", "position"}`) is the variant's state, saved with every checkpoint, so a
      resumed run continues the refill sequence exactly. Refill prompts may repeat prompts that TRL's sampler
      serves in the same epoch (verl's refill consumes the next batches of the same dataloader instead). verl's
      DAPO script generates `gen_prompt_bsz = 3 × train_prompt_bsz` prompts per round; here a round has the
      training batch's size.
    - Metric: the trainer's weighted reward sum (verl: `acc` in the DAPO script), exact equality, NaN rewards
      ignored, ±inf raises; as `zero_variance_filter`.
    - Evaluation never refills (verl filters training batches only); the filter still applies, like
      `zero_variance_filter`.
    - Merge: prompt tensors are left-padded and completion-side tensors right-padded to the widest piece; extra
      all-padding columns are never read (masks 0). Rows of a refill piece may sit behind more left padding than
      at generation; with rotary position embeddings (the supported causal LMs) the log-probs are unchanged up to
      rounding. Multimodal outputs (pixel values, token type ids) are refused. TRL logs its metrics
      (`reward`, ...) once per generation call, refills included; the completions table is rebuilt to show the
      rollouts that train. Tested on the transformers `generate` back end only; the vLLM path goes through the
      same TRL method and is not exercised here.

    Args:
        batch (`RolloutBatch`): the merged global batch.
        dapo_max_gen_batches (`int`): used by the trainer's refill loop, not here.
        state (`dict`): the refill source position (read and advanced by the refill loop, not here).

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return zero_variance_filter(batch)


# ---- pure helpers ------------------------------------------------------------------------------------------------


def weighted_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """`(N,)` weighted reward sum as the trainer computes it; NaN where every reward function returned None."""
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def mixed_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(N/G,)` bool: the groups DAPO keeps (scored rewards not all equal; `G = 1`: scored)."""
    if torch.isinf(rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    keep = zero_variance_filter(RolloutBatch(rewards, None, group_size))
    return keep.view(-1, group_size).any(dim=1)


def assign_groups(
    kept: list[list[tuple[int, int]]],
    dropped: list[list[tuple[int, int]]],
    mixed: torch.Tensor,
    piece: int,
    num_processes: int,
) -> None:
    """Append the `(piece, local group)` pairs of one generation call to each process's kept / dropped lists.

    `mixed` is the call's global `(P × groups_per_process,)` group mask, in process order."""
    per_process = mixed.numel() // num_processes
    for p in range(num_processes):
        for j in range(per_process):
            (kept if bool(mixed[p * per_process + j]) else dropped)[p].append((piece, j))


def select_groups(kept: list[tuple[int, int]], dropped: list[tuple[int, int]], groups: int) -> list[tuple[int, int]]:
    """The first `groups` kept groups in generation order, then (cap hit) the earliest dropped ones."""
    chosen = kept[:groups]
    return chosen + dropped[: groups - len(chosen)]


def group_rows(selection: list[tuple[int, int]], group_size: int) -> list[tuple[int, int]]:
    """`(piece, local row)` of every rollout of the selected groups, in order."""
    return [(piece, j * group_size + k) for piece, j in selection for k in range(group_size)]


def pad_to_width(x: torch.Tensor, width: int, side: str, value: float) -> torch.Tensor:
    """Pad dim 1 of `x` to `width` on `side` ("left" or "right") with `value`."""
    extra = width - x.size(1)
    if extra <= 0:
        return x
    pad = x.new_full((x.size(0), extra, *x.shape[2:]), value)
    return torch.cat([pad, x] if side == "left" else [x, pad], dim=1)


def merge_rows(pieces: list[torch.Tensor], rows: list[tuple[int, int]], side: str, value: float) -> torch.Tensor:
    """Rows `rows` (`(piece, row)`) of tensors padded on `side`, stacked in order; 1-D pieces are just indexed."""
    if pieces[0].dim() > 1:
        width = max(p.size(1) for p in pieces)
        pieces = [pad_to_width(p, width, side, value) for p in pieces]
    offsets = [0]
    for p in pieces[:-1]:
        offsets.append(offsets[-1] + p.size(0))
    index = torch.tensor([offsets[piece] + row for piece, row in rows], dtype=torch.long, device=pieces[0].device)
    return torch.cat(pieces, dim=0).index_select(0, index)


def merge_outputs(outputs: list[dict[str, Any]], rows: list[tuple[int, int]], pad_token_id: int) -> dict[str, Any]:
    """Row-wise merge of TRL generation outputs (without `num_items_in_batch`, which the caller recomputes)."""
    keys = set(outputs[0])
    for out in outputs[1:]:
        if set(out) != keys:
            raise ValueError(f"Generation outputs differ in keys: {sorted(keys ^ set(out))}.")
    unknown = keys - set(LEFT_PADDED) - set(RIGHT_PADDED) - set(ROW_KEYS) - set(SKIPPED_KEYS)
    if unknown:
        raise NotImplementedError(
            f"rollout_filter={VARIANT_ID!r} cannot merge the generation outputs {sorted(unknown)} (multimodal inputs "
            "are not supported); use rollout_filter='zero_variance_filter' (no refill)."
        )
    merged: dict[str, Any] = {}
    for key in sorted(keys - set(SKIPPED_KEYS)):
        if key in LEFT_PADDED:
            side, value = "left", LEFT_PADDED[key]
        elif key in RIGHT_PADDED:
            side, value = "right", RIGHT_PADDED[key]
        else:
            side, value = "right", 0.0
        value = pad_token_id if value is None else value
        merged[key] = merge_rows([out[key] for out in outputs], rows, side, value)
    return merged


def draw_refill_indices(state: dict, dataset_len: int, count: int, seed: int) -> list[int]:
    """The next `count` dataset indices of the refill source; advances `state` (`epoch`, `position`) in place.

    Epoch `e` is `torch.randperm(dataset_len)` under a generator seeded `seed + 104729 · (e + 1)`; a draw that
    runs past an epoch's end continues in the next epoch."""
    if dataset_len <= 0:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} needs a non-empty, sized train_dataset to refill from.")
    epoch, position = int(state.get("epoch", 0)), int(state.get("position", 0))
    drawn: list[int] = []
    while len(drawn) < count:
        generator = torch.Generator().manual_seed(seed + 104729 * (epoch + 1))
        perm = torch.randperm(dataset_len, generator=generator)
        take = perm[position : position + count - len(drawn)].tolist()
        drawn += take
        position += len(take)
        if position >= dataset_len:
            epoch, position = epoch + 1, 0
    state["epoch"], state["position"] = epoch, position
    return drawn


# ---- the refill loop (called by GRPOTrainer._generate_and_score_completions) ----------------------------------


def _log_snapshot(logs: dict[str, Any], n: int) -> dict[tuple[str, str], list]:
    """The last `n` entries of every per-rollout deque of TRL's completions-table logs, by (section, key)."""
    found = {("top", k): list(logs[k])[-n:] for k in ("prompt", "completion", "advantages", "images")}
    found.update({("rewards", k): list(v)[-n:] for k, v in logs["rewards"].items()})
    found.update({("extra", k): list(v)[-n:] for k, v in logs["extra"].items()})
    return found


def refill_generation_batch(
    trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any], generate: Callable[[list], dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """DAPO refill of one local generation batch: returns the merged `(inputs, output)`, exactly as large as the
    original, and sets `trainer._rewards_per_func` to the merged global reward matrix (process order).

    `generate` is TRL's `_generate_and_score_completions`. Every process runs the same number of rounds."""
    if trainer._needs_steps:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} does not combine with multi-turn step-credit advantages.")
    dataset = trainer.train_dataset
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} needs a map-style train_dataset (with len) to refill from.")
    args, accel = trainer.args, trainer.accelerator
    group_size, procs, rank = trainer.num_generations, accel.num_processes, accel.process_index
    local_n = output["completion_ids"].size(0)
    groups = local_n // group_size
    cap = args.dapo_max_gen_batches
    state = trainer.variant_state[VARIANT_ID]

    pieces, piece_inputs, piece_rewards = [output], [inputs], [trainer._rewards_per_func]
    n_global = local_n * procs
    log_pieces = [_log_snapshot(trainer._logs, n_global)]
    kept: list[list[tuple[int, int]]] = [[] for _ in range(procs)]
    dropped: list[list[tuple[int, int]]] = [[] for _ in range(procs)]
    assign_groups(kept, dropped, mixed_groups(weighted_rewards(piece_rewards[0], trainer.reward_weights), group_size),
                  0, procs)
    while any(len(k) < groups for k in kept) and (cap == 0 or len(pieces) < cap):
        indices = draw_refill_indices(state, len(dataset), groups * procs, args.seed)
        mine = indices[rank * groups : (rank + 1) * groups]
        new_inputs = [dict(dataset[i]) for i in mine for _ in range(group_size)]  # as TRL's RepeatSampler
        pieces.append(generate(new_inputs))
        piece_inputs.append(new_inputs)
        piece_rewards.append(trainer._rewards_per_func)
        log_pieces.append(_log_snapshot(trainer._logs, n_global))
        rewards = weighted_rewards(piece_rewards[-1], trainer.reward_weights)
        assign_groups(kept, dropped, mixed_groups(rewards, group_size), len(pieces) - 1, procs)

    selection = [select_groups(kept[p], dropped[p], groups) for p in range(procs)]
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode]["groupx/dapo_gen_batches"].append(float(len(pieces)))
    n_kept = sum(min(len(k), groups) for k in kept)
    trainer._metrics[mode]["groupx/dapo_kept_groups"].append(float(n_kept))
    if n_kept < groups * procs:
        logger.warning(
            "dapo_dynamic_sampling: dapo_max_gen_batches=%d reached with %d of %d groups kept; the rest are "
            "zero-variance groups, masked out of this step.", cap, n_kept, groups * procs,
        )
    if len(pieces) == 1:
        return inputs, output

    rows = group_rows(selection[rank], group_size)
    merged = merge_outputs(pieces, rows, trainer._tokenizer.pad_token_id)
    loss_mask = merged["completion_mask"] if "tool_mask" not in merged else merged["completion_mask"] * merged["tool_mask"]
    merged["num_items_in_batch"] = accel.gather(loss_mask.sum()).sum()
    merged_inputs = [piece_inputs[piece][row] for piece, row in rows]

    # Global rewards of the merged batch, in process order (every process knows every process's selection).
    global_rows = [(piece, p * local_n + row) for p in range(procs) for piece, row in group_rows(selection[p], group_size)]
    trainer._rewards_per_func = merge_rows(piece_rewards, global_rows, "right", 0.0)
    # Completions table: the rollouts that train (TRL logged each call's rollouts; the deques hold one batch).
    for section, key in log_pieces[-1]:
        values = [snap.get((section, key), []) for snap in log_pieces]
        if any(len(v) != n_global for v in values):
            continue  # not logged for every call (e.g. images); left as TRL wrote it
        deque_ = trainer._logs[key] if section == "top" else trainer._logs[section][key]
        deque_.clear()
        deque_.extend(values[piece][row] for piece, row in global_rows)
    return merged_inputs, merged
