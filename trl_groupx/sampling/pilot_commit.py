"""Pilot-Commit prompt selection: a pilot stage spends a few rollouts per candidate prompt to estimate its accuracy;
prompts whose estimate falls in a band wait in a buffer and are committed (trained with the run's full group) at
least one pilot round later; prompts the pilot finds solved are excluded for good.

Chosen through the prompt-selection seam (`prompt_sampler.py`): the selection function runs the pilot rounds (extra
completions through TRL's own generator, scored by the run's reward functions, `pilot_commit_glue.py`) and returns
the committed prompts; TRL then generates their `num_generations` rollouts, and the first
`pilot_commit_reused_pilots` of each committed group are replaced by that prompt's stored pilot rollouts
(`pilot_commit_glue.reuse_pilot_rollouts`). The buffer (with its pilot rollouts), the exclusion set and the
candidate stream are the variant's `variant_state`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..contracts import RolloutBatch
from ..registry import register
from . import keep_all
from .prompt_sampler import prompt_selection

VARIANT_ID = "pilot_commit"
SELECTION_RULES = ("random", "max_variance", "most_recent")
OFFICIAL = "databricks/pilot-commit@6def20ea211fc936ed092a5a08624807c54df381"


# ---- pure parts ---------------------------------------------------------------------------------------------------


def pilot_accuracy(rewards: torch.Tensor, success_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per candidate `(C, n)` pilot rewards → `(p̂, std)`, both `(C,)` float64: `p̂` the share of scored (non-NaN)
    pilot rollouts with reward `≥ success_threshold`, `std = sqrt(p̂(1 − p̂))` (the population std of those 0/1
    accuracies, `np.std` in the official `ReplayBuffer.add`); NaN for a candidate with no scored rollout. ±inf
    rewards raise."""
    r = rewards.detach().cpu().double()
    if torch.isinf(r).any():
        raise ValueError("rollout_filter='pilot_commit' got an infinite pilot reward; check the reward functions.")
    scored = ~torch.isnan(r)
    trials = scored.sum(1).double()
    successes = ((r >= success_threshold) & scored).sum(1).double()
    p_hat = torch.where(trials > 0, successes / trials.clamp(min=1), torch.full_like(trials, math.nan))
    return p_hat, (p_hat * (1.0 - p_hat)).sqrt()


def classify(p_hat: torch.Tensor, low: float, high: float, exclude: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(kept, excluded)` bool masks: kept `low ≤ p̂ ≤ high` (official `filter_batch`), excluded `p̂ ≥ exclude`
    (official `exclude_batch`; never with `exclude=None`). A NaN estimate is neither."""
    kept = (p_hat >= low) & (p_hat <= high)
    excluded = p_hat >= exclude if exclude is not None else torch.zeros_like(kept)
    return kept, excluded


def pilot_sample_count(pilot_samples: int | None, num_generations: int) -> int:
    """Pilot rollouts per candidate: `pilot_samples`, or by default a quarter of the group (the official scripts split
    one group of 128 into pilot 32 + commit 96, of 64 into 16 + 48), at least 2 (our floor: one pilot rollout gives
    p̂ ∈ {0, 1}, never inside the band)."""
    return pilot_samples if pilot_samples is not None else max(2, num_generations // 4)


def reused_pilot_count(reused_pilots: int | None, pilot_samples: int) -> int:
    """Pilot rollouts trained in a committed group: `reused_pilots`, or every pilot rollout (official
    `exploration.n_effective: null`)."""
    return pilot_samples if reused_pilots is None else reused_pilots


def max_variance_subset(successes: list[bool], size: int, rng: np.random.Generator) -> list[int]:
    """Indices of `size` of a prompt's pilot rollouts with successes and failures as even as they can be (official
    `ReplayBuffer._maxvar_downsample_binary`: `size // 2` successes, the rest failures, topped up from the other
    side when one runs short; each side drawn by `rng.choice` without replacement, successes first). All of them,
    in order, when `size` is their number (the official buffer samples only when `n_effective ≠ n`). A rollout that
    is not a success (NaN rewards included: our choice, the official rewards are 0/1) is a failure."""
    if size >= len(successes):
        return list(range(len(successes)))
    ones = np.flatnonzero(np.asarray(successes, dtype=bool))
    zeros = np.flatnonzero(~np.asarray(successes, dtype=bool))
    need_ones = size // 2
    if len(ones) < need_ones:
        need_ones = len(ones)
    elif len(zeros) < size - need_ones:
        need_ones = size - len(zeros)
    chosen_ones = rng.choice(ones, size=need_ones, replace=False) if need_ones > 0 else []
    chosen_zeros = rng.choice(zeros, size=size - need_ones, replace=False) if size - need_ones > 0 else []
    return [int(i) for i in np.concatenate([chosen_ones, chosen_zeros])]


BUFFER_KEYS = ("buffer_index", "buffer_step", "buffer_round", "buffer_std")


def empty_buffer() -> dict[str, torch.Tensor]:
    return {k: torch.zeros(0, dtype=torch.float64 if k == "buffer_std" else torch.int64) for k in BUFFER_KEYS}


def buffer_add(state: dict, indices: list[int], std: list[float], step: int, round_: int = 0) -> None:
    """Add (or replace: the official buffer is keyed by prompt) each prompt with its pilot std, its pilot `step`
    (generation batch) and `round_` (pilot round)."""
    columns = {k: state[k].tolist() for k in BUFFER_KEYS}
    for i, s in zip(indices, std):
        if i in columns["buffer_index"]:
            at = columns["buffer_index"].index(i)
            for k in BUFFER_KEYS:
                del columns[k][at]
        for k, v in zip(BUFFER_KEYS, (int(i), int(step), int(round_), float(s))):
            columns[k].append(v)
    for k in BUFFER_KEYS:
        state[k] = torch.tensor(columns[k], dtype=state[k].dtype)


def buffer_flush(state: dict, current_step: int, off_steps: int) -> int:
    """Evict entries with `current_step − step > off_steps` (official `ReplayBuffer.flush`); returns the count."""
    keep = current_step - state["buffer_step"] <= off_steps
    for key in BUFFER_KEYS:
        state[key] = state[key][keep]
    return int((~keep).sum())


def buffer_take(state: dict, size: int, rule: str, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Remove and return up to `size` buffered prompts (all of them when the buffer holds at most `size`, official
    `ReplayBuffer.sample`): `random` (uniform without replacement), `max_variance` (largest pilot std, then most
    recent, official `_sample_by_variance`; remaining ties to the earlier entry: our choice), `most_recent`.
    Returns `(prompt, pilot round)` pairs."""
    n = state["buffer_index"].numel()
    if size <= 0 or n == 0:
        return []
    if n <= size:
        chosen = list(range(n))
    elif rule == "random":
        chosen = sorted(rng.choice(n, size=size, replace=False).tolist())
    else:
        std, step = state["buffer_std"].tolist(), state["buffer_step"].tolist()
        key = (lambda j: (-std[j], -step[j], j)) if rule == "max_variance" else (lambda j: (-step[j], j))
        chosen = sorted(range(n), key=key)[:size]
    taken = [(int(state["buffer_index"][j]), int(state["buffer_round"][j])) for j in chosen]
    keep = torch.ones(n, dtype=torch.bool)
    keep[chosen] = False
    for key in BUFFER_KEYS:
        state[key] = state[key][keep]
    return taken


def draw_candidates(state: dict, count: int, dataset_size: int, seed: int) -> list[int]:
    """The next `count` prompts of the candidate stream: passes over the dataset, each a permutation seeded
    `[seed, pass]`, skipping excluded prompts (each prompt comes once per pass, so skipping at draw time is the
    official exclusion "from the next epoch on"). At the end of a pass the buffer is emptied (official end-of-epoch
    `flush(enforce=True)`, `fit` lines 846–847). Raises when every prompt is excluded."""
    excluded = set(state["excluded"].tolist())
    if len(excluded) >= dataset_size:
        raise RuntimeError("rollout_filter='pilot_commit': every prompt of the dataset is excluded (pilot accuracy ≥ "
                           "pilot_commit_exclude_threshold); raise the threshold or set it to None.")
    out: list[int] = []
    while len(out) < count:
        order = np.random.default_rng([int(seed), int(state["pass"])]).permutation(dataset_size)
        while state["cursor"] < dataset_size and len(out) < count:
            index = int(order[state["cursor"]])
            state["cursor"] += 1
            if index not in excluded:
                out.append(index)
        if state["cursor"] >= dataset_size:  # end of a pass: the official end-of-epoch flush empties the buffer
            state["pass"], state["cursor"] = int(state["pass"]) + 1, 0
            state.update(empty_buffer())
    return out


def init_state(state: dict) -> None:
    if "buffer_index" not in state:
        state.update(empty_buffer())
        state.update(excluded=torch.zeros(0, dtype=torch.int64), step=0, round=0, draws=0, cursor=0, **{"pass": 0})
        state.update(committed_rounds=torch.zeros(0, 2, dtype=torch.int64))


def fill_nearest(piloted: list[tuple[float, int, int]], committed: list[int], count: int) -> list[tuple[int, int]]:
    """Up to `count` distinct prompts piloted in this batch and not committed, nearest to the band first (distance
    `max(low − p̂, p̂ − high, 0)`, NaN last), then earlier round, then the order piloted: `(pilot round, prompt)`."""
    out: list[tuple[int, int]] = []
    taken = set(committed)
    for _, pilot_round, index in sorted(piloted, key=lambda x: (x[0], x[1])):
        if len(out) < count and index not in taken:
            out.append((pilot_round, index))
            taken.add(index)
    return out


def commit_rounds(state: dict, pilot: Any, *, num_prompts: int, pilot_prompts: int, low: float, high: float,
                  exclude: float | None, off_steps: int, rule: str, max_rounds: int, seed: int) -> tuple[list[int], dict]:
    """One generation batch's selection (official `RayPCTrainer.fit`, per round: commit from the buffer first, then
    pilot new candidates, buffer the band, mark the solved), until `num_prompts` are committed.

    `pilot(indices) -> (C, n)` rewards of the candidates' pilot rollouts. Returns the committed prompts and counts.
    When `max_rounds` rounds leave the batch short, it is filled by `fill_nearest` (the official loop raises
    instead; our choice, so that a run whose prompts drift out of the band keeps training: those groups carry
    little or no GRPO signal, as in plain GRPO); a batch that cannot be filled even so raises.
    `state["step"]` is the generation-batch clock (official `global_steps`); the flush that the official loop runs
    after each update runs here before the next batch's rounds, with that update's step."""
    init_state(state)
    buffer_flush(state, int(state["step"]), off_steps)
    state["step"] = int(state["step"]) + 1
    committed: list[int] = []
    stats = {"rounds": 0, "kept": 0, "too_easy": 0, "too_hard": 0, "excluded": 0, "filled": 0}
    rounds_of_commit: list[tuple[int, int]] = []
    piloted: list[tuple[float, int, int]] = []  # this batch's candidates: (distance to the band, round, prompt)
    while True:
        rng = np.random.default_rng([int(seed), int(state["draws"])])
        state["draws"] = int(state["draws"]) + 1
        taken = buffer_take(state, num_prompts - len(committed), rule, rng)
        committed += [index for index, _ in taken]
        rounds_of_commit += [(pilot_round, int(state["round"])) for _, pilot_round in taken]
        if len(committed) == num_prompts:
            break  # the official loop stops generating once the batch is full
        if max_rounds and stats["rounds"] >= max_rounds:
            fill = fill_nearest(piloted, committed, num_prompts - len(committed))
            if len(committed) + len(fill) < num_prompts:
                raise RuntimeError(
                    f"rollout_filter='pilot_commit': {stats['rounds']} pilot rounds (pilot_commit_max_rounds="
                    f"{max_rounds}) met {len(committed) + len(fill)} distinct prompts for {num_prompts} slots; raise "
                    "pilot_commit_max_rounds (0 = no limit) or pilot_commit_pilot_prompts, or widen "
                    "pilot_commit_band_low/high.")
            committed += [index for _, index in fill]
            rounds_of_commit += [(pilot_round, int(state["round"])) for pilot_round, _ in fill]
            stats["filled"] = len(fill)
            break
        candidates = draw_candidates(state, pilot_prompts, int(state["dataset_size"]), seed)
        p_hat, std = pilot_accuracy(pilot(candidates), float(state["success_threshold"]))
        kept, too_easy_for_good = classify(p_hat, low, high, exclude)
        buffer_add(state, [c for c, k in zip(candidates, kept.tolist()) if k],
                   [s for s, k in zip(std.tolist(), kept.tolist()) if k], int(state["step"]), int(state["round"]))
        newly = [c for c, e in zip(candidates, too_easy_for_good.tolist()) if e]
        state["excluded"] = torch.tensor(sorted(set(state["excluded"].tolist()) | set(newly)), dtype=torch.int64)
        distance = (torch.maximum(low - p_hat, p_hat - high)).clamp(min=0).nan_to_num(nan=math.inf)
        piloted += [(float(d), int(state["round"]), c) for d, c in zip(distance.tolist(), candidates)]
        state["round"] = int(state["round"]) + 1
        stats["rounds"] += 1
        stats["kept"] += int(kept.sum())
        stats["too_easy"] += int((p_hat > high).sum())
        stats["too_hard"] += int((p_hat < low).sum())
        stats["excluded"] += len(newly)
    state["committed_rounds"] = torch.tensor(rounds_of_commit, dtype=torch.int64).view(-1, 2)
    return committed, stats


@prompt_selection(VARIANT_ID)
def pilot_commit_select(state: dict, num_prompts: int, dataset_size: int, trainer: Any = None, *, seed: int,
                        num_generations: int, pilot_commit_pilot_samples: int | None,
                        pilot_commit_reused_pilots: int | None, pilot_commit_pilot_prompts: int,
                        pilot_commit_band_low: float, pilot_commit_band_high: float,
                        pilot_commit_exclude_threshold: float | None, pilot_commit_off_steps: int,
                        pilot_commit_selection: str, pilot_commit_max_rounds: int,
                        pilot_commit_success_threshold: float) -> list[int]:
    """The committed prompts of the next generation batch (`commit_rounds` with pilots from
    `pilot_commit_glue.PilotRecorder`, which also keeps the pilot rollouts to be trained)."""
    if trainer is None:
        raise ValueError("rollout_filter='pilot_commit' generates pilot rollouts: the seam must pass `trainer`.")
    from .pilot_commit_glue import PilotRecorder

    init_state(state)
    state["dataset_size"], state["success_threshold"] = int(dataset_size), float(pilot_commit_success_threshold)
    samples = pilot_sample_count(pilot_commit_pilot_samples, num_generations)
    recorder = PilotRecorder(trainer, state, samples, reused_pilot_count(pilot_commit_reused_pilots, samples))
    committed, stats = commit_rounds(
        state, recorder.pilot, num_prompts=num_prompts,
        pilot_prompts=pilot_commit_pilot_prompts or num_prompts, low=pilot_commit_band_low,
        high=pilot_commit_band_high, exclude=pilot_commit_exclude_threshold, off_steps=pilot_commit_off_steps,
        rule=pilot_commit_selection, max_rounds=pilot_commit_max_rounds, seed=seed)
    recorder.keep_for_training(committed, seed)
    metrics = trainer._metrics["train"]
    for name, value in stats.items():
        metrics[f"groupx/pilot_commit_{name}"].append(float(value))
    metrics["groupx/pilot_commit_buffer_size"].append(float(state["buffer_index"].numel()))
    return committed


def _validate(config: Any) -> None:
    for name, low in (("pilot_commit_pilot_samples", 1), ("pilot_commit_reused_pilots", 0),
                      ("pilot_commit_pilot_prompts", 0), ("pilot_commit_off_steps", 0),
                      ("pilot_commit_max_rounds", 0)):
        value = getattr(config, name)
        if value is None and name in ("pilot_commit_pilot_samples", "pilot_commit_reused_pilots"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r}: use an integer ≥ {low} (official scripts: pilot 32 + commit 96 "
                             "rollouts per group, every pilot reused; off-steps 4; pilot prompts 0 = the batch's "
                             "prompt count; max rounds 10, 0 = no limit).")
    samples = pilot_sample_count(config.pilot_commit_pilot_samples, config.num_generations)
    reused = reused_pilot_count(config.pilot_commit_reused_pilots, samples)
    if reused > samples:
        raise ValueError(f"pilot_commit_reused_pilots={reused} > pilot_commit_pilot_samples={samples}: a committed "
                         "group can reuse at most the pilot rollouts its prompt had; lower it or raise the pilots.")
    if reused >= config.num_generations:
        raise ValueError(f"pilot_commit_reused_pilots={reused} (None = every one of the {samples} pilot rollouts) ≥ "
                         f"num_generations={config.num_generations}: a committed group needs at least one fresh "
                         "rollout; lower pilot_commit_pilot_samples / pilot_commit_reused_pilots or raise "
                         "num_generations (official: pilot 32 + commit 96).")
    lo, hi = config.pilot_commit_band_low, config.pilot_commit_band_high
    for name, v in (("pilot_commit_band_low", lo), ("pilot_commit_band_high", hi)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{name}={v!r}: use an accuracy in [0, 1] (paper band 0.125 ≤ p̂ ≤ 0.75).")
    if lo > hi:
        raise ValueError(f"pilot_commit_band_low={lo} > pilot_commit_band_high={hi}: the band is empty; use low ≤ high.")
    ex = config.pilot_commit_exclude_threshold
    if ex is not None and (isinstance(ex, bool) or not isinstance(ex, (int, float)) or not 0.0 < ex <= 1.0):
        raise ValueError(f"pilot_commit_exclude_threshold={ex!r}: use an accuracy in (0, 1] (paper: 1.0, prompts the "
                         "pilot always solves), or None to exclude nothing.")
    if ex is not None and ex <= hi:
        raise ValueError(f"pilot_commit_exclude_threshold={ex} ≤ pilot_commit_band_high={hi}: buffered prompts would "
                         "be excluded; use a threshold above the band.")
    if config.pilot_commit_selection not in SELECTION_RULES:
        raise ValueError(f"pilot_commit_selection={config.pilot_commit_selection!r}: use one of {SELECTION_RULES}.")
    t = config.pilot_commit_success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"pilot_commit_success_threshold={t!r}: use a finite reward at or above which a pilot rollout "
                         "is correct (1.0 for 0/1 accuracy rewards).")
    if getattr(config, "use_vllm", False):
        raise ValueError("rollout_filter='pilot_commit' generates its pilot rollouts with transformers `generate`; "
                         "set use_vllm=False.")


@register(
    VARIANT_ID,
    name="Pilot-Commit",
    paper="Kim et al., Spend Your Rollouts Where It Counts: Rollout Allocation for Group-Based RL Post-Training "
          "(Pilot-Commit; arXiv id not in our sources), https://github.com/databricks/pilot-commit",
    official_code=f"{OFFICIAL}:recipe/pc/pc_ray_trainer.py",
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "pilot_commit_pilot_samples": None, "pilot_commit_reused_pilots": None,
           "pilot_commit_pilot_prompts": 0,
           "pilot_commit_band_low": 0.125, "pilot_commit_band_high": 0.75, "pilot_commit_exclude_threshold": 1.0,
           "pilot_commit_off_steps": 4, "pilot_commit_selection": "random", "pilot_commit_max_rounds": 10,
           "pilot_commit_success_threshold": 1.0},
    params=("pilot_commit_pilot_samples", "pilot_commit_reused_pilots", "pilot_commit_pilot_prompts",
            "pilot_commit_band_low", "pilot_commit_band_high", "pilot_commit_exclude_threshold",
            "pilot_commit_off_steps", "pilot_commit_selection", "pilot_commit_max_rounds", "pilot_commit_success_threshold"),
    stateful=True,
    validate=_validate,
)
def pilot_commit(batch: RolloutBatch, *, state: dict) -> torch.Tensor:
    r"""Pilot-Commit: pilot each candidate prompt with a few rollouts, commit the full group to the prompts whose
    pilot accuracy lies in a band, one round or more later, and drop the always-solved prompts for good.

    Official code, `databricks/pilot-commit@6def20ea211fc936ed092a5a08624807c54df381`:
    `recipe/pc/pc_ray_trainer.py` `RayPCTrainer.filter_batch` (lines 287–328: keep `lower ≤ mean acc ≤ 1 − upper`),
    `exclude_batch` (330–352: exclude `mean acc ≥ exclude_threshold_upper`), `fit` (354 on; per round, 477–533:
    commit up to the missing prompts from the buffer *before* this round's pilots are added, so a prompt is committed
    one round or more after its pilot; 612–650: filter, buffer, mark exclusions; 669–686: keep running rounds until
    the batch is full, at most `max_num_gen_batches`; 700: flush after the update; 846–847: buffer emptied at the
    end of each epoch); `recipe/pc/replay_buffer.py`
    `ReplayBuffer.add` (34–68, keyed by prompt, std of the accuracies), `flush` (70–87: evict `step − added >
    max_off_steps`), `sample` (106–183: everything when it holds ≤ size, else by the prompt rule; `random` is the
    config default, `_sample_by_variance` 242–260); `recipe/pc/config/pc_trainer.yaml` lines 21–32 (off-steps 4,
    prompt rule random, response rule max_variance, thresholds, exploration n 8). Paper setting (our
    `official-code` notes): pilot 32 and commit 96 rollouts, band 0.125 ≤ p̂ ≤ 0.75, exclude p̂ ≥ 1.

    Per generation batch (`B = generation_batch_size / num_generations` prompts), in `pilot_commit_select`:

    1. flush: drop buffered prompts piloted more than `pilot_commit_off_steps` generation batches before the last
       one (the official flush after each update);
    2. rounds until `B` prompts are committed: take up to the missing number from the buffer by
       `pilot_commit_selection`; if still short, pilot the next `pilot_commit_pilot_prompts` (0 = `B`) prompts of the
       candidate stream (seeded passes over the dataset without the excluded prompts) with
       `pilot_commit_pilot_samples` rollouts each; `p̂` = share with reward `≥ pilot_commit_success_threshold` (NaN
       rewards are not trials; an all-NaN pilot gives no estimate: neither buffered nor excluded); buffer `low ≤ p̂ ≤
       high`; exclude `p̂ ≥ pilot_commit_exclude_threshold`. After `pilot_commit_max_rounds` rounds (0 = no limit)
       a short batch is filled with this batch's piloted prompts nearest to the band (**choice**: the official
       loop raises after `max_num_gen_batches`; `groupx/pilot_commit_filled` counts them).
    3. Each committed prompt's group of `num_generations` (`G`) rows: the first `n_eff = pilot_commit_reused_pilots`
       rows are `n_eff` of its stored pilot rollouts, which TRL's generation call skips
       (`pilot_commit_glue.generate_with_pilots`), with their stored rewards; the rest are generated fresh (official
       `fit` 495–500 and 653–664: the commit group is `n_effective` pilot responses followed by the `n` fresh
       ones). GRPO's advantages are taken over the whole group.

    The pilot rollouts are the response rule's pick (official `ReplayBuffer.sample`, `buffer_response_sampling_method
    = max_variance`, `_maxvar_downsample_binary` 207–239): all of them when `n_eff = pilot_commit_pilot_samples`
    (the default, official `n_effective: null`), else `max_variance_subset` (half successes, half failures, seeded
    `[seed, step, prompt]`). They are trained as they are, without off-policy correction (official: verl recomputes
    the old log-probs of the whole batch with the current actor, `fit` 718–728, so their ratio starts at 1; here
    TRL computes their old and reference log-probs with the other rows').
    `groupx/pilot_commit_reused_rows` counts them; `groupx/pilot_commit_pilot_age` is their mean age in pilot rounds.

    Choices (TRL has one group size per run and fixed-size generation batches):

    - **One group of `num_generations` rows holds pilots and fresh rollouts**: `G = n_eff + n_commit`, the official
      scripts' total (p32c96: 128 = 32 + 96; p16c48). The default pilot count is `G // 4` (at least 2), their split.
      TRL's generation call runs on the `G − n_eff` fresh rows of each group only.
    - `pilot_commit_reused_pilots=0` trains fresh rollouts only (the pilots only select).
    - `pilot_commit_selection` is the *prompt* rule (`random`, the config default; `max_variance`; `most_recent`);
      the response rule is always `max_variance`, as the official config.
    - The clock of `off_steps` is the generation batch (official `global_steps`, one update per train batch).
    - Pilot rollouts are generated by the current policy at the run's sampling settings, split evenly over the
      processes; every process gathers the rewards and the completions and makes the same selection.

    This function (the rollout filter on the committed batch) keeps every rollout and clears `state["pending"]`.

    State (`variant_state`, saved with checkpoints, identical on every process): `buffer_index / buffer_step /
    buffer_round / buffer_std` (buffered prompts, their pilot batch, pilot round and pilot std), `excluded` (sorted
    prompt ids), the candidate stream `pass` / `cursor`, `step` (generation batches selected), `round` (pilot
    rounds run), `draws` (seeds the random rule as `[seed, draws]`), `committed_rounds` `(B, 2)` (pilot round and
    commit round of each prompt of the last batch), `dataset_size`, `success_threshold`, and with reuse on
    `pilot_rollouts` (buffered prompt → its pilot round, completion ids, per-function rewards).
    `commit_pilots` (the batch's chosen pilots) lives only between the selection and the generation it feeds.

    Args:
        batch (`RolloutBatch`): the global generation batch of the committed prompts.
        state (`dict`): see above.

    Returns:
        `torch.Tensor`: `(N,)` bool, all `True`.
    """
    keep = keep_all(batch, "pilot_commit")
    state["pending"] = torch.zeros(0, dtype=torch.int64)
    return keep
