"""RePO (Replay-Enhanced Policy Optimization): a per-prompt replay buffer of past rollouts with their behaviour
log-probs; each prompt's update uses its on-policy group plus `k` replayed rollouts of the same prompt.

This module holds the variant's record and its pure parts: the buffer (update, bounds, retrieval), the split
advantage normalisation and the loss weights of the replayed rows. The trainer glue that appends the replayed rows
to the generation batch is `trl_groupx/sampling/replay.py`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..advantages.group_norm import group_normalized_advantages
from ..contracts import RolloutBatch
from ..registry import register

VARIANT_ID = "repo"
OFFICIAL_COMMIT = "119fef699104b52adf915ca630b8b03400b0e0ea"
_OFFICIAL = f"SihengLi99/RePO@{OFFICIAL_COMMIT}:src/replay_grpo_trainer.py"
STRATEGIES = ("highest_k", "recent_k")
# TRL loss types whose surrogate has a trl_groupx reference (`objective.TRL_REFERENCE_SURROGATE`): the replayed rows
# need a per-row weight inside the loss, so these run through `GRPOTrainer.compute_objective_loss`.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")


def validate(config: Any) -> None:
    """Refuse flag values RePO cannot run with, naming the flag and the fix."""
    if config.repo_strategy not in STRATEGIES:
        raise ValueError(
            f"repo_strategy={config.repo_strategy!r}: use one of {STRATEGIES} (official default 'highest_k'; the "
            "official 'random_k', 'max_variance_k' and 'all' are not implemented)."
        )
    if config.repo_k < 1:
        raise ValueError(f"repo_k={config.repo_k}: replay at least one rollout per prompt (official 8).")
    if config.repo_max_cache < 1:
        raise ValueError(f"repo_max_cache={config.repo_max_cache}: keep at least one rollout per prompt (official 16).")
    if not config.repo_k <= config.repo_min_cache <= config.repo_max_cache:
        raise ValueError(
            f"repo_k={config.repo_k}, repo_min_cache={config.repo_min_cache}, repo_max_cache={config.repo_max_cache}: "
            "need repo_k <= repo_min_cache <= repo_max_cache, so that every replayed prompt gets exactly repo_k "
            "rollouts and replay can start (official 8 <= 16 <= 16)."
        )
    if config.repo_max_prompts is not None and config.repo_max_prompts < 1:
        raise ValueError(f"repo_max_prompts={config.repo_max_prompts}: use a positive bound, or None for no bound.")
    if config.repo_off_coef < 0:
        raise ValueError(f"repo_off_coef={config.repo_off_coef}: use a weight >= 0 (official 1.0).")
    if config.repo_adv_eps <= 0:
        raise ValueError(f"repo_adv_eps={config.repo_adv_eps}: use a positive epsilon (official 1e-4).")
    if config.beta != 0.0:
        raise ValueError(
            f"rollout_filter='repo' with beta={config.beta}: the official loss applies the KL term to on-policy "
            "tokens only, which is not implemented; set beta=0.0 (the official setting)."
        )
    if config.use_vllm:
        raise ValueError(
            "rollout_filter='repo' with use_vllm=True: replayed rows carry no vLLM sampling log-probs; use "
            "transformers generation (use_vllm=False)."
        )
    if config.entropy_coef != 0.0 or config.use_adaptive_entropy:
        raise ValueError(
            "rollout_filter='repo' weights the replayed rows on trl_groupx's objective path, which does not support "
            "TRL's entropy bonus yet; set entropy_coef=0 and use_adaptive_entropy=False."
        )
    if config.loss_type in ("vespo", "luspo"):
        raise ValueError(
            f"rollout_filter='repo' with loss_type={config.loss_type!r}: the replayed rows are weighted inside the "
            f"loss, which needs a trl_groupx surrogate; use one of {LOSS_TYPES} (official 'grpo') or a trl_groupx "
            "objective."
        )


@register(
    VARIANT_ID,
    name="RePO (Replay-Enhanced Policy Optimization)",
    paper="RePO: Replay-Enhanced Policy Optimization, arXiv:2506.09340",
    official_code=_OFFICIAL,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "repo_strategy": "highest_k", "repo_k": 8, "repo_min_cache": 16,
           "repo_max_cache": 16, "repo_off_coef": 1.0, "repo_adv_eps": 1e-4, "num_generations": 8,
           "loss_type": "grpo", "beta": 0.0},
    params=("repo_strategy", "repo_k", "repo_min_cache", "repo_max_cache", "repo_max_prompts", "repo_off_coef",
            "repo_adv_eps"),
    stateful=True,
    validate=validate,
)
def repo(batch: RolloutBatch, *, repo_k: int = 8, state: dict) -> torch.Tensor:
    r"""RePO's sampling stage: every on-policy rollout trains (keep all), and the trainer appends replayed rows.

    Per training generation batch (`trl_groupx/sampling/replay.py`, called at the end of
    `GRPOTrainer._generate_and_score_completions`):

    1. Retrieve, for each prompt group of the global batch, `k = repo_k` entries of that prompt's buffer when it holds
       at least `repo_min_cache` entries (`select_replay`; `highest_k`: the `k` largest `Σ_j r_j` of the stored
       reward functions, ties oldest first; `recent_k`: the newest `k`). Retrieval reads the buffer BEFORE this
       batch is added, so with the official 8 / 16 / 16 a prompt is replayed from its third visit on.
    2. Add the batch's rollouts to their prompts' buffers (`update_buffer`): completion ids, behaviour log-probs
       `log π_old` (the policy that sampled them, a no-grad forward when TRL did not compute them) and the per-function
       rewards; at most `repo_max_cache` entries per prompt (oldest evicted), at most `repo_max_prompts` prompts
       (least recently visited evicted; `None` = unbounded, as the official defaultdict).
    3. Split advantages (`split_advantages`): the on-policy group keeps the run's advantages (TRL's
       `(r - mean) / (std + 1e-4)` by default, which is the official on-policy block); each replayed block of `k`
       rows is normalised on its own, `A = (r - mean_block) / (std_block + repo_adv_eps)` with the stored rewards
       (weighted by `reward_weights`), unbiased std, no division when `scale_rewards="none"` (`"batch"` also
       divides by the block's std: choice, the official code has only on/off). An all-correct
       replayed block gets advantage 0.
    4. Loss (`replay_token_weights`): replayed rows enter the ratio `exp(log π - log π_old)` with their stored
       behaviour log-probs; the per-token loss of a replayed row is weighted by `c = repo_off_coef`, so that
       `L = L_on + c · L_off` with both parts normalised as the official `_aggregate` does: `grpo` and `dr_grpo`
       divide both parts by the micro-batch's row count (one `sequence_mean` / `constant` normaliser), `bnpo`
       divides each part by its own token count.

    This function is the stage's filter: it keeps every rollout (`(N,)` True; NaN-reward rows are still left out of
    the advantages by the advantage stage). `state` is the buffer, read and written by the trainer glue.

    Reference: SihengLi99/RePO@119fef699104b52adf915ca630b8b03400b0e0ea:src/replay_grpo_trainer.py —
    `__init__` l.569-574 (per-prompt `deque(maxlen=max_cache_size)`), `_replay_step` l.1098-1212 (skip a prompt whose
    buffer holds fewer than `min_cache_to_replay`, l.1135; `k = min(len(buf), num_replays)`, l.1139; `highest_k`
    sorts by `rewards_per_func.sum()`, l.1148-1152; `recent_k` the deque's right end, l.1155-1157),
    `_update_cache` l.1288-1336 (every rank appends the gathered batch, l.1317), `_generate_and_score_completions`
    l.1349-1352 (replay retrieved before the cache update), split advantages l.1444-1480 (on- and off-policy blocks
    each `(r - mean) / (std + 1e-4)`), `_compute_loss` l.1607-1700 (ratio against the stored `old_per_token_logps`,
    `_aggregate` per `loss_type` on the on- and off-policy token masks, `loss = on_loss + off_policy_loss_coef *
    off_loss`, KL on on-policy tokens only). Defaults: scripts/train_replay_grpo.slurm l.70-84 (grpo, beta 0,
    split, off coef 1.0, highest_k, 8 replays, G = 8, min cache 16, max cache 16).

    Choices (where the official code is silent or does something we do not):

    - The buffer is global: every process holds the same buffer (updated from the gathered batch, as the official
      `_update_cache`), keyed by a hash of the prompt's token ids (`advantages/_prompt_keys.py`; official: the
      prompt text). Retrieval runs on the gathered batch; the replayed rows are then dealt out evenly, process `p`
      taking the `p`-th slice, so a group split over processes is replayed once. When the replayed row count is not
      a multiple of `processes × steps_per_generation` (TRL splits each process's batch into that many equal
      micro-batches), null rows (the prompt with no completion token, advantage 0) pad it; they hold no loss token but
      count as rows in the `grpo`/`dr_grpo` row normaliser, like rollouts a sampling filter drops.
    - Replay and buffer updates run in training only (the official code also replays and caches evaluation
      batches).
    - Stored behaviour log-probs are at the trainer's `temperature`; completion tokens are stored up to the
      completion mask's length (tokens after EOS are not stored; a truncated completion masked by
      `mask_truncated_completions` is stored empty and trains no token when replayed).
    - `highest_k` ranks by the unweighted sum of the reward functions, as the official code; NaN rewards count as 0
      and a fully unscored entry ranks last. The replayed block's advantage uses the weighted reward, like the
      on-policy block.
    - `bnpo`: on-policy and replayed tokens are normalised separately (official); `dapo`/`cispo` (not in the
      official code): one global token count over on-policy and replayed tokens, replayed tokens weighted by `c`.
    - Loss path: TRL's loss types run through their trl_groupx reference surrogate
      (`GRPOTrainer.compute_objective_loss`, same numbers), which carries the row weight; TRL's clip-ratio metrics
      are not logged there.
    - Not supported (refused): `beta != 0` (official: KL on on-policy tokens only), TRL's entropy bonus, vLLM
      generation, `vespo`/`luspo`, multi-turn tool masks and multimodal inputs, and compositions that add per-row
      tensors of their own to the batch (objective group ids, Balanced Aggregation, teacher log-probs, turn ids).
    - Memory: each micro-batch carries the replayed rows too (up to twice the rows with `k = G`).

    Args:
        batch (`RolloutBatch`): the global on-policy batch.
        repo_k (`int`): replayed rollouts per prompt (used by the trainer glue).
        state (`dict`): the replay buffer (`update_buffer`).

    Returns:
        `torch.Tensor`: `(N,)` bool, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError("rollout_filter='repo' got ±inf rewards; reward functions must return finite values or NaN.")
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool)


# ---- the buffer ----------------------------------------------------------------------------------------------------


def update_buffer(
    state: dict,
    keys: list[int],
    completion_ids: list[torch.Tensor],
    logps: list[torch.Tensor],
    rewards_per_func: torch.Tensor,
    *,
    max_cache: int,
    max_prompts: int | None,
) -> None:
    """Append one entry per rollout to its prompt's buffer, in batch order, in place.

    `state["prompts"][key]` holds the prompt's entries as row-aligned tensors, oldest first: `completion_ids`
    `(n, L)` long and `logps` `(n, L)` float32 (the behaviour log-probs of those tokens), both right-padded with 0
    to the longest kept entry, `lengths` `(n,)` long and `rewards` `(n, K)` float32. A prompt keeps at most
    `max_cache` entries (the oldest dropped, as `deque(maxlen=...)`); `state["order"]` lists the prompts by last
    visit (most recent last), and beyond `max_prompts` prompts the least recently visited are dropped."""
    prompts = state.setdefault("prompts", {})
    order = state.setdefault("order", [])
    for key in dict.fromkeys(int(k) for k in keys):  # one concatenation per prompt, rows in batch order
        rows = [i for i, k in enumerate(keys) if int(k) == key]
        new_ids = [completion_ids[i].detach().to("cpu", torch.long).reshape(-1) for i in rows]
        new_logps = [logps[i].detach().to("cpu", torch.float32).reshape(-1) for i in rows]
        old = prompts.get(key)
        lengths = torch.tensor([x.numel() for x in new_ids], dtype=torch.long)
        rewards = rewards_per_func[rows].detach().to("cpu", torch.float32)
        if old is not None:
            lengths = torch.cat([old["lengths"], lengths])[-max_cache:]
            rewards = torch.cat([old["rewards"], rewards])[-max_cache:]
        width = int(lengths.max()) if lengths.numel() else 0
        ids = _stack(new_ids, width, 0)
        lps = _stack(new_logps, width, 0.0)
        if old is not None:
            ids = torch.cat([_stack(list(old["completion_ids"]), width, 0), ids])[-max_cache:]
            lps = torch.cat([_stack(list(old["logps"]), width, 0.0), lps])[-max_cache:]
        prompts[key] = {"completion_ids": ids[-max_cache:, :width], "logps": lps[-max_cache:, :width],
                        "lengths": lengths[-max_cache:], "rewards": rewards[-max_cache:]}
        if key in order:
            order.remove(key)
        order.append(key)
    if max_prompts is not None:
        while len(order) > max_prompts:
            prompts.pop(order.pop(0), None)


def _stack(rows: list[torch.Tensor], width: int, value: float) -> torch.Tensor:
    """`(n, width)` rows cut or right-padded with `value` to `width` (cut only removes padding: `width` is at least
    every kept entry's length)."""
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype if rows else torch.float32)
    for i, row in enumerate(rows):
        n = min(width, row.numel())
        out[i, :n] = row[:n]
    return out


def buffered_entry(entry: dict, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entry `j` of a prompt's buffer: its completion ids and behaviour log-probs (unpadded) and its `(K,)` rewards."""
    n = int(entry["lengths"][j])
    return entry["completion_ids"][j, :n], entry["logps"][j, :n], entry["rewards"][j]


def ranking_score(rewards: torch.Tensor) -> torch.Tensor:
    """`(n,)` official `highest_k` key of `(n, K)` stored rewards: `Σ_j r_j` (NaN as 0), `-inf` when all are NaN."""
    score = rewards.nansum(dim=-1)
    return score.masked_fill(torch.isnan(rewards).all(dim=-1), float("-inf"))


def select_replay(rewards: torch.Tensor, *, k: int, min_cache: int, strategy: str) -> list[int]:
    """Indices (into a prompt's buffer, oldest first) of the entries to replay; `[]` below `min_cache` entries.

    `highest_k`: the `k` largest `ranking_score`, ties oldest first (Python's stable `sorted(..., reverse=True)`);
    `recent_k`: the `k` newest, oldest first."""
    n = rewards.shape[0]
    if n < min_cache or n == 0:
        return []
    k = min(k, n)
    if strategy == "recent_k":
        return list(range(n - k, n))
    if strategy == "highest_k":
        order = torch.sort(ranking_score(rewards), descending=True, stable=True).indices
        return order[:k].tolist()
    raise ValueError(f"Unknown repo_strategy {strategy!r}; expected one of {STRATEGIES}.")


def weighted_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """`(n,)` weighted reward sum as the trainer computes it; NaN where every reward function returned None."""
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func)).nansum(dim=1)
    return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=1), float("nan"))


def replay_block_advantages(
    rewards: torch.Tensor, block_size: int, *, scale_rewards: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """`(R,)` advantages of replayed rows laid out in contiguous blocks of `block_size` (one block per prompt), each
    normalised on its own: `(r - mean_block) / (std_block + eps)` (unbiased std over non-NaN rewards; NaN → 0;
    `scale_rewards="none"`: centred only). Official split normalisation, l.1466-1480."""
    if rewards.numel() == 0:
        return rewards.clone()
    scale = "none" if scale_rewards == "none" else "group"
    return group_normalized_advantages(rewards, block_size, scale_rewards=scale, eps=eps)


def split_advantages(
    rewards: torch.Tensor, is_replay: torch.Tensor, block_size: int, replay_block_size: int,
    *, scale_rewards: str = "group", eps: float = 1e-4,
) -> torch.Tensor:
    """`(N,)` official split normalisation over a batch where `is_replay` marks the replayed rows: the on-policy
    rows, in order, form blocks of `block_size` (G), the replayed rows blocks of `replay_block_size` (k), each block
    normalised by its own mean and std (`replay_block_advantages`). The trainer applies the on-policy half through
    the run's advantage stage and this function's replayed half to the rows it appends."""
    out = torch.zeros_like(rewards)
    on = ~is_replay
    out[on] = replay_block_advantages(rewards[on], block_size, scale_rewards=scale_rewards, eps=eps)
    out[is_replay] = replay_block_advantages(rewards[is_replay], replay_block_size, scale_rewards=scale_rewards,
                                             eps=eps)
    return out


# ---- the loss ------------------------------------------------------------------------------------------------------


def replay_token_weights(is_replay: torch.Tensor, mask: torch.Tensor, aggregation: str, off_coef: float) -> torch.Tensor:
    """`(B, 1)` weight of each row's per-token loss in one micro-batch, so that the run's aggregation gives the
    official `L_on + c · L_off`.

    `is_replay` is `(B,)`: 0 on-policy, 1 replayed. One normaliser shared by both parts (`sequence_mean`,
    `constant`, `global_token_mean`, ...): on-policy 1, replayed `c`. `token_mean` (bnpo), whose official parts are
    normalised by their own token counts `n_on`, `n_off`: on-policy `n / n_on`, replayed `c · n / n_off` with
    `n = n_on + n_off`, so that `Σ w l m / n = Σ_on l m / n_on + c Σ_off l m / n_off`."""
    replay = is_replay.to(mask.dtype).view(-1, 1)
    weights = 1.0 - replay + off_coef * replay
    if aggregation == "token_mean":
        n_off = (mask * replay).sum()
        n_on = mask.sum() - n_off
        n = n_on + n_off
        on_scale = n / n_on if n_on > 0 else n.new_zeros(())
        off_scale = n / n_off if n_off > 0 else n.new_zeros(())
        weights = (1.0 - replay) * on_scale + off_coef * replay * off_scale
    return weights
