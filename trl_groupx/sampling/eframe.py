"""EFRame (Exploration-Filter-Replay): extra high-temperature rollouts for all-fail prompts, an advantage filter,
and a bounded replay buffer of high-advantage rollouts.

This module holds the variant's record and its pure parts (hard-prompt selection, the |A| selections, the replay
buffer and its cadence). The trainer glue that generates, masks and appends rows is `trl_groupx/sampling/eframe_glue.py`,
built on RePO's row-appending seam (`trl_groupx/sampling/replay.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register

VARIANT_ID = "eframe"
OFFICIAL_COMMIT = "173b698f3202156769b29c36a762e94d11c69327"
_OFFICIAL = f"597358816/EFRame@{OFFICIAL_COMMIT}:verl/trainer/ray_trainer.py"


def validate(config: Any) -> None:
    """Refuse flag values EFRame cannot run with, naming the flag and the fix."""
    if config.eframe_extra_n < 2:
        raise ValueError(f"eframe_extra_n={config.eframe_extra_n}: the extra group needs at least 2 rollouts to have "
                         "a non-zero advantage (official additional_n=20).")
    if config.eframe_extra_temperature <= 0:
        raise ValueError(f"eframe_extra_temperature={config.eframe_extra_temperature}: use a positive sampling "
                         "temperature (official additional_temperature=1.2).")
    for name in ("eframe_hard_eps", "eframe_filter_threshold", "eframe_extra_keep_threshold",
                 "eframe_replay_threshold"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name}={getattr(config, name)}: use a threshold >= 0.")
    if config.eframe_replay_freq < 0:
        raise ValueError(f"eframe_replay_freq={config.eframe_replay_freq}: use a positive period in generation "
                         "batches (official replay_freq=5), or 0 to turn replay off.")
    if config.eframe_replay_size <= 0:
        raise ValueError(f"eframe_replay_size={config.eframe_replay_size}: the buffer holds this many generation "
                         "batches of rows; use a positive value (official replay_size=2.0).")
    if config.beta != 0.0:
        raise ValueError(
            f"rollout_filter='eframe' with beta={config.beta}: the appended (exploration and replayed) rows carry no "
            "reference log-probs, so the official KL loss (kl_coef 1e-2) is not implemented; set beta=0.0."
        )
    if config.use_vllm:
        raise ValueError("rollout_filter='eframe' with use_vllm=True: the extra rollouts are generated through "
                         "transformers `generate` and appended rows carry no vLLM sampling log-probs; set "
                         "use_vllm=False.")
    if getattr(config, "token_weighting", None) is not None:
        raise ValueError(f"rollout_filter='eframe' with token_weighting={config.token_weighting!r}: EFRame selects rows "
                         "by a per-rollout advantage and appends rows with one advantage each; per-token advantages "
                         "are not supported. Unset token_weighting.")
    if getattr(config, "generation_temperatures", None) is not None:
        raise ValueError("rollout_filter='eframe' with generation_temperatures: the extra rollouts have their own "
                         "temperature (eframe_extra_temperature); unset generation_temperatures.")


@register(
    VARIANT_ID,
    name="EFRame (Exploration-Filter-Replay)",
    paper="EFRame: Deeper Reasoning via Exploration-Filter-Replay Reinforcement Learning Framework, arXiv:2506.22200",
    official_code=_OFFICIAL,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "eframe_extra_n": 20, "eframe_extra_temperature": 1.2,
           "eframe_hard_eps": 0.01, "eframe_extra_keep_threshold": 1.0, "eframe_filter_threshold": 0.05,
           "eframe_replay_threshold": 1.0, "eframe_replay_freq": 5, "eframe_replay_size": 2.0,
           "epsilon": 0.2, "beta": 0.0, "temperature": 1.0},
    params=("eframe_extra_n", "eframe_extra_temperature", "eframe_hard_eps", "eframe_extra_keep_threshold",
            "eframe_filter_threshold", "eframe_replay_threshold", "eframe_replay_freq", "eframe_replay_size"),
    stateful=True,
    validate=validate,
)
def eframe(batch: RolloutBatch, *, state: dict) -> torch.Tensor:
    r"""EFRame's sampling stage: every on-policy rollout reaches the advantage stage (keep all); the trainer glue
    then filters, explores and replays (`trl_groupx/sampling/eframe_glue.py`, end of
    `GRPOTrainer._generate_and_score_completions`, training only).

    Per training generation batch of `N = B·G` rows (global; `A` the run's advantages, GRPO's
    `(r - mean_g) / (std_g + eps)` by default):

    1. **Filter**: a rollout with `|A| <= eframe_filter_threshold` (0.05) is masked out of the loss (completion mask
       0, advantage 0); this drops every all-equal group (`A = 0`), including the all-fail ones.
    2. **Exploration**: a prompt whose group is all-fail (every scored weighted reward `< eframe_hard_eps`, 0.01;
       with GRPO then also `|A| < eps`) gets `n = eframe_extra_n` (20) extra completions sampled at
       `eframe_extra_temperature` (1.2) by TRL's own generator and scored by the run's reward functions; their
       advantages are computed within the prompt's extra group of `n` only (group normalisation, std unbiased,
       `scale_rewards` of the run), and only the extra rollouts with `|A| > eframe_extra_keep_threshold` (1) are
       appended to the batch (`select_abs_above`). With binary rewards and `k` successes among `n`, the successes
       have `A = (1 - k/n)/std`, the failures `-(k/n)/std`: the minority outcome passes `|A| > 1`.
    3. **Replay**: the rows of the training batch (kept on-policy rows and appended exploration rows) with
       `|A| > eframe_replay_threshold` (1) enter a FIFO buffer of at most `eframe_replay_size · N` rows (2·N),
       with their prompt, completion, behaviour log-probs and advantage (`add_to_buffer`). Every
       `eframe_replay_freq` (5) generation batches, when the buffer holds at least `N` rows, it is replayed
       (`replay_indices`): the whole buffer when full, else a uniform sample (without replacement) of
       `⌊size/N⌋·N` rows; the replayed rows are appended with their stored log-probs as `old_per_token_logps`
       and their stored advantages.

    Reference: 597358816/EFRame@173b698f3202156769b29c36a762e94d11c69327 —
    verl/trainer/ray_trainer.py: `_select_by_advantage` l.166-177 (`|A| > threshold` on the first token's
    advantage), `_select_hard_prompts` l.180-191 (`|A| < eps & reward < eps`, eps 0.01 at l.726, whole groups),
    `fit` l.655-800: capacities l.719-722 (`replay_size · initial_batch_size`, `initial_batch_size` = rows of the
    on-policy batch), filter `|A| > 0.05` l.727, extra generation at `additional_temperature` with
    `additional_n` l.728-745, advantages of the extra rows computed on the extra batch alone l.747-750, extra rows
    kept at `|A| > 1` l.752, the replay buffer takes the trained batch's `|A| > 1` rows with their old log-probs
    l.764-771, replay every `replay_freq` steps once it holds one batch, the full buffer or a random
    `⌊size/B⌋·B` rows l.775-782; verl/trainer/buffer.py `Buffer` l.5-53 (FIFO, newest kept); defaults
    verl/workers/rollout/config.py l.27-28 (n 20, T 1.2) and examples/config.yaml l.18-23 (replay_size 2.0,
    replay_freq 5, KL loss low_var_kl 1e-2), rollout n 5 l.53.

    Choices (where the official code is silent or does something we do not):

    - Filtered rollouts are masked (mask 0, advantage 0), not removed; the official `batch_buffer` that accumulates
      filtered rows until a full batch exists (l.761-763) is not reproduced: every generation batch trains. With
      TRL's `grpo` loss a masked row still counts in the row mean.
    - Appended rows (exploration and replay) join the same update as the on-policy rows; the official code runs the
      replay as a second actor update at that step (l.781-782). The batch grows; its rows are dealt out evenly over
      processes, padded with null rows (no loss token) to a multiple of `processes × steps_per_generation`
      (RePO's seam).
    - Only the three parts: the official `_filtering_overlong` (drop truncated rows with `A > 0`, l.194-208, l.756)
      is not applied (use TRL's `mask_truncated_completions`), and the official 32-prompt padding of the hard batch
      (`duplicate_gen_batch`, l.227-233, which crashes for 1-15 hard prompts and merges the duplicates' groups) is
      replaced by an even split of the hard prompts over processes, each process padding its share with a repeat
      whose rollouts are discarded.
    - Replay cadence counts training generation batches (the official `global_step` counts loop iterations) and
      the buffer's random sample uses a generator seeded from `seed` and that count (identical on every process,
      exact on resume). Replayed advantages are the stored ones, not recomputed (official).
    - Behaviour log-probs of the exploration rows are computed by a no-grad forward at the trainer's `temperature`
      (official `_compute_old_log_probs` at the actor's temperature), not at the sampling temperature 1.2.
    - NaN rewards: a group with no scored reward is not all-fail; unscored rows get `A = 0` and are filtered.
    - The extra groups' advantages use TRL's eps 1e-4 (official 1e-6), which moves no |A| across 1 for binary rewards.
      With `mask_truncated_completions=True`, truncated extra rollouts (TRL's rule: last token neither EOS nor pad)
      are not appended (their rewards still enter their group's statistics).
    - The official rollout n = 5 (`examples/config.yaml`) is in the recipe, not in `flags`: the contract suite's
      batch of 8 rows needs a group size dividing it.
    - Official clip (0.8, 1.2) (`clip_ratio_high` ignored, see the note in official-code) is TRL's `epsilon=0.2`.
      The official KL loss (1e-2) is refused (`beta` must be 0): the appended rows carry no reference log-probs.
    - Not supported (refused): vLLM, `generation_temperatures`, rollout_func/tools, multimodal inputs, per-token
      advantages of a token stage, and per-row tensors other stages add to the batch.

    Args:
        batch (`RolloutBatch`): the global on-policy batch.
        state (`dict`): the replay buffer and the generation-batch count (written by the trainer glue).

    Returns:
        `torch.Tensor`: `(N,)` bool, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError("rollout_filter='eframe' got ±inf rewards; reward functions must return finite values or NaN.")
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool)


# ---- selections ----------------------------------------------------------------------------------------------------


def all_fail_groups(rewards: torch.Tensor, group_size: int, eps: float = 0.01) -> list[int]:
    """Indices of the groups (contiguous blocks of `group_size` in `(N,)` rewards) whose every scored reward is
    `< eps` (official `_select_hard_prompts`); a group with no scored reward (all NaN) is not all-fail."""
    groups = rewards.view(-1, group_size)
    scored = ~torch.isnan(groups)
    fail = (groups.nan_to_num(nan=float("-inf")) < eps) | ~scored
    return torch.nonzero(fail.all(dim=1) & scored.any(dim=1)).flatten().tolist()


def select_abs_above(advantages: torch.Tensor, threshold: float) -> torch.Tensor:
    """`(N,)` bool: `|A| > threshold` (official `_select_by_advantage`, absolute=True)."""
    return advantages.abs() > threshold


# ---- the replay buffer ---------------------------------------------------------------------------------------------

BUFFER_FIELDS = ("prompt_ids", "completion_ids", "logps", "advantages")


def add_to_buffer(state: dict, rows: dict[str, list], capacity: int) -> None:
    """Append rows (lists aligned over `BUFFER_FIELDS`: unpadded prompt ids, completion ids and behaviour log-probs,
    and a float advantage) to the FIFO buffer `state["buffer"]`, keeping the newest `capacity` rows (official
    `Buffer.add` / `_truncate_to_capacity`)."""
    buffer = state.setdefault("buffer", {f: [] for f in BUFFER_FIELDS})
    for f in BUFFER_FIELDS:
        buffer[f].extend(rows[f])
        del buffer[f][: max(0, len(buffer[f]) - capacity)]


def buffer_size(state: dict) -> int:
    return len(state.get("buffer", {}).get("advantages", []))


def replay_due(batch_count: int, freq: int, size: int, batch_rows: int) -> bool:
    """Replay at every `freq`-th generation batch (1-based count) once the buffer holds one batch of rows."""
    return freq > 0 and batch_count % freq == 0 and size >= batch_rows


def replay_indices(size: int, capacity: int, batch_rows: int, generator: torch.Generator) -> list[int]:
    """Buffer rows to replay: all of them when the buffer is full, else a uniform sample without replacement of
    `⌊size / batch_rows⌋ · batch_rows` rows (sorted, oldest first)."""
    if size >= capacity:
        return list(range(size))
    count = (size // batch_rows) * batch_rows
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())
