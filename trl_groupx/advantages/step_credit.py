"""Multi-turn step credit: the per-step data model and the vectorised group statistics shared by `agentflow`,
`gigpo` and `hgpo` (catalog family Q, issue 8).

TRL 1.16 runs a multi-turn episode (tools, `environment_factory`) as ONE row of the generation batch: the turns are
concatenated in `completion_ids`, and `output["tool_mask"]` is 0 on the tool-result tokens between them
(`GRPOTrainer._tool_call_loop`). A *step* here is one model turn of one episode, i.e. one maximal run of
`tool_mask == 1` inside the completion (`turn_index_from_tool_mask`). The step-credit functions take per-step
tensors (`StepBatch`, `S` steps in all) plus the `(N,)` episode rewards the trainer already has, and return `(S,)`
per-step advantages; `step_to_token_advantages` lays them out as `(N, T)` per-token advantages, the shape TRL's
loss accepts.

Layout conventions (same as the rest of the package): `N` episodes (rollouts) in `N / G` contiguous groups of `G`
(the episodes of one prompt); episode `e` belongs to prompt group `e // G`. Steps may be listed in any order; their
order inside an episode is given by `StepBatch.index`.

Everything is vectorised over groups: groups are found with `torch.unique(..., return_inverse=True)` on integer
keys and their statistics with `scatter_add`; the only Python loops run over time steps (discounted returns) or
history levels (HGPO), never over groups.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# verl / verl-agent's epsilon in (x − mean) / (std + ε) (GiGPO, HGPO and Flow-GRPO all run on verl).
VERL_EPS = 1e-6
# `StepBatch.final_state` of an episode whose rollout gave no final observation (state keys are >= 0).
NO_FINAL_STATE = -1


@dataclass
class StepBatch:
    """Per-step view of a batch of multi-turn episodes, `S` steps in all.

    Attributes:
        episode (`torch.Tensor`): `(S,)` long, the episode (rollout row, in `[0, N)`) each step belongs to.
        index (`torch.Tensor`): `(S,)` long, the step's position in its episode (0 for the first turn); only the
            order matters, and an `(episode, index)` pair must be unique.
        state (`torch.Tensor`): `(S,)` long, the anchor-state key: a hash of the environment observation the step
            acted on (`state_key`), equal for identical states. Only used by `gigpo` and `hgpo`.
        reward (`torch.Tensor`): `(S,)` float, the immediate environment reward `r_t` of the step (NaN: unscored).
        final_state (`torch.Tensor` or `None`): optional `(E,)` long, per episode (row), the key of the observation
            after its last step (`NO_FINAL_STATE` where the rollout did not give one); `None` when no rollout
            gave any. Only used by `graphgpo` (the next state of an episode's last transition).
        module (`torch.Tensor` or `None`): optional `(S,)` long, the key (`state_key` of the name) of the program
            module (or agent) whose LM call the step is; `None` when the rollouts gave no module labels. Used by
            `mmgrpo` (a step is one LM call of a multi-module program) and `ccpo` (the agent of each turn).
    """

    episode: torch.Tensor
    index: torch.Tensor
    state: torch.Tensor
    reward: torch.Tensor
    final_state: torch.Tensor | None = None
    module: torch.Tensor | None = None

    @classmethod
    def from_lists(
        cls,
        states: Sequence[Sequence[Any]],
        rewards: Sequence[Sequence[float]] | None = None,
        final_states: Sequence[Any] | None = None,
        modules: Sequence[Sequence[Any]] | None = None,
    ) -> StepBatch:
        """Build from per-episode lists: `states[e][t]` is the observation (any hashable/serialisable value, hashed
        with `state_key`) and `rewards[e][t]` the reward of step `t` of episode `e` (zeros when omitted);
        `final_states[e]` (optional) the observation after the episode's last step, `None` where unknown;
        `modules[e][t]` (optional) the name of the program module step `t` of episode `e` called."""
        episode, index, state, reward = [], [], [], []
        for e, ep_states in enumerate(states):
            ep_rewards = rewards[e] if rewards is not None else [0.0] * len(ep_states)
            if len(ep_rewards) != len(ep_states):
                raise ValueError(f"Episode {e}: {len(ep_states)} states but {len(ep_rewards)} step rewards.")
            for t, (s, r) in enumerate(zip(ep_states, ep_rewards)):
                episode.append(e)
                index.append(t)
                state.append(state_key(s))
                reward.append(float(r))
        final = None
        if final_states is not None:
            if len(final_states) != len(states):
                raise ValueError(f"{len(states)} episodes but {len(final_states)} final states.")
            final = torch.tensor([NO_FINAL_STATE if f is None else state_key(f) for f in final_states],
                                 dtype=torch.long)
        module = None
        if modules is not None:
            if [len(m) for m in modules] != [len(s) for s in states]:
                raise ValueError("modules must give one module name per step of every episode.")
            module = torch.tensor([state_key(m) for ep in modules for m in ep], dtype=torch.long)
        return cls(
            episode=torch.tensor(episode, dtype=torch.long),
            index=torch.tensor(index, dtype=torch.long),
            state=torch.tensor(state, dtype=torch.long),
            reward=torch.tensor(reward, dtype=torch.float32),
            final_state=final,
            module=module,
        )

    @property
    def num_steps(self) -> int:
        return int(self.episode.numel())


def _canonical(x: Any) -> Any:
    # Same idea as verl-agent's `to_hashable` (gigpo/core_gigpo.py), but a stable byte string instead of Python's
    # salted `hash`, so that every process (and every run) gives the same key.
    if isinstance(x, (bool, int, float, str, bytes)) or x is None:
        return x
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.flatten().tolist()))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((str(k), _canonical(v)) for k, v in x.items())))
    if isinstance(x, Iterable):
        return ("seq", tuple(_canonical(e) for e in x))
    raise TypeError(f"Cannot derive an anchor-state key from {type(x).__name__}.")


def state_key(observation: Any) -> int:
    """Stable signed 63-bit key of an observation (exact-match anchor states, as GiGPO's default
    `enable_similarity=False`): BLAKE2b of its canonical repr. Identical observations give identical keys on every
    process; different ones collide with probability ~2^-63 per pair."""
    digest = hashlib.blake2b(repr(_canonical(observation)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=False) >> 1


# --- validation and layout --------------------------------------------------------------------------------------


def check_steps(episode_rewards: torch.Tensor, group_size: int, steps: StepBatch, flag: str) -> None:
    """Shape and value checks; ±inf rewards raise a `ValueError` naming `flag`."""
    n = episode_rewards.shape[0]
    if episode_rewards.dim() != 1:
        raise ValueError(f"{flag}: episode rewards must be (N,), got {tuple(episode_rewards.shape)}.")
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"{flag}: {n} episodes do not split into groups of {group_size}.")
    s = steps.num_steps
    for name in ("index", "state", "reward"):
        if getattr(steps, name).shape != (s,):
            raise ValueError(f"{flag}: StepBatch.{name} must be ({s},), got {tuple(getattr(steps, name).shape)}.")
    if steps.final_state is not None and steps.final_state.shape != (n,):
        raise ValueError(f"{flag}: StepBatch.final_state must be ({n},), got {tuple(steps.final_state.shape)}.")
    if steps.module is not None and steps.module.shape != (s,):
        raise ValueError(f"{flag}: StepBatch.module must be ({s},), got {tuple(steps.module.shape)}.")
    if s and (steps.episode.min() < 0 or steps.episode.max() >= n):
        raise ValueError(f"{flag}: StepBatch.episode must lie in [0, {n}).")
    if s and steps.index.min() < 0:
        raise ValueError(f"{flag}: StepBatch.index must be >= 0.")
    if s and torch.unique(steps.episode * (int(steps.index.max()) + 1) + steps.index).numel() != s:
        raise ValueError(f"{flag}: two steps share the same (episode, index).")
    if torch.isinf(episode_rewards).any() or torch.isinf(steps.reward).any():
        raise ValueError(f"{flag}: infinite reward (episode or step); the reward functions / environment must return "
                         "finite values (NaN marks an unscored rollout).")


def step_rank(steps: StepBatch) -> torch.Tensor:
    """`(S,)` position 0, 1, ... of each step in its episode, ordered by `steps.index` (gaps in `index` removed)."""
    s = steps.num_steps
    if s == 0:
        return torch.zeros(0, dtype=torch.long)
    key = steps.episode * (int(steps.index.max()) + 1) + steps.index
    order = torch.argsort(key)
    ep_sorted = steps.episode[order]
    pos = torch.arange(s)
    is_first = torch.ones(s, dtype=torch.bool)
    is_first[1:] = ep_sorted[1:] != ep_sorted[:-1]
    first_pos = torch.cummax(torch.where(is_first, pos, torch.zeros_like(pos)), dim=0).values
    rank = torch.empty(s, dtype=torch.long)
    rank[order] = pos - first_pos
    return rank


def dense_by_episode(values: torch.Tensor, steps: StepBatch, num_episodes: int, fill: float = 0):
    """`(E, L_max)` matrix with `values[s]` at `(episode[s], rank[s])`, `fill` elsewhere; also returns the rank."""
    rank = step_rank(steps)
    width = int(rank.max()) + 1 if rank.numel() else 1
    out = torch.full((num_episodes, width), fill, dtype=values.dtype)
    out[steps.episode, rank] = values
    return out, rank


def discounted_returns(steps: StepBatch, num_episodes: int, gamma: float) -> torch.Tensor:
    """`(S,)` per-step discounted return `G_t = r_t + γ G_{t+1}` inside each episode (verl-agent
    `compute_step_discounted_returns`, GiGPO Eq. 5). Vectorised over episodes; loops over time steps only. A NaN
    step reward makes the returns of that step and of every earlier step of its episode NaN."""
    dense, rank = dense_by_episode(steps.reward.double(), steps, num_episodes, fill=0.0)
    ret = torch.zeros_like(dense)
    running = torch.zeros(num_episodes, dtype=dense.dtype)
    for t in range(dense.shape[1] - 1, -1, -1):
        running = dense[:, t] + gamma * running
        ret[:, t] = running
    return ret[steps.episode, rank].to(steps.reward.dtype)


# --- grouped statistics -----------------------------------------------------------------------------------------


def segment_normalize(
    values: torch.Tensor,
    segments: torch.Tensor,
    valid: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    scale: bool = True,
    unbiased: bool = True,
    eps: float = VERL_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative `(v − mean_g) / (std_g + eps)` (or `v − mean_g` when `scale=False`) for every entry, with the
    groups given by integer `segments` and only `valid` entries counted (each with its `weights`, default 1).

    Returns the normalised values (0 for invalid entries and for groups of total weight < 2, whose statistics are
    undefined) and the `(S,)` total weight of each entry's group. `unbiased=True` divides the squared deviations
    by `W − 1` (torch.std, as GiGPO / verl), `False` by `W` (`std(unbiased=False)`, as HGPO). Groups whose valid
    values are all equal give exactly 0 (no `ε`-amplified rounding noise). Computed in float64.
    """
    v = torch.where(valid, values.double(), torch.zeros((), dtype=torch.float64))
    zero = torch.zeros((), dtype=torch.float64)
    w = valid.double() if weights is None else torch.where(valid, weights.double(), zero)
    if segments.numel() == 0:
        return torch.zeros_like(values), torch.zeros_like(values, dtype=torch.float64)
    uniq, inv = torch.unique(segments, return_inverse=True)
    m = uniq.numel()
    wsum = torch.zeros(m, dtype=torch.float64).scatter_add_(0, inv, w)
    mean = torch.zeros(m, dtype=torch.float64).scatter_add_(0, inv, w * v) / wsum.clamp(min=1e-300)
    dev = torch.where(valid, v - mean[inv], torch.zeros((), dtype=torch.float64))
    big = torch.finfo(torch.float64).max
    vmax = torch.full((m,), -big, dtype=torch.float64).scatter_reduce_(0, inv, torch.where(valid, v, -big), "amax")
    vmin = torch.full((m,), big, dtype=torch.float64).scatter_reduce_(0, inv, torch.where(valid, v, big), "amin")
    dev = torch.where((vmax == vmin)[inv], torch.zeros((), dtype=torch.float64), dev)
    if scale:
        ss = torch.zeros(m, dtype=torch.float64).scatter_add_(0, inv, w * dev * dev)
        denom = (wsum - 1.0) if unbiased else wsum
        std = torch.sqrt(ss / denom.clamp(min=1e-300))
        dev = dev / (std[inv] + eps)
    ok = valid & (wsum[inv] >= 2)
    out = torch.where(ok, dev, torch.zeros((), dtype=torch.float64))
    return out.to(values.dtype if values.is_floating_point() else torch.float32), wsum[inv]


def episode_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    stats: str = "trajectory",
    scale: bool = True,
    unbiased: bool = True,
    eps: float = VERL_EPS,
) -> torch.Tensor:
    """`(S,)` episode-level group-relative advantage of each step's episode (GRPO on the trajectory outcome,
    broadcast to every turn): `(R_e − mean_g) / (std_g + ε)` over the episodes of prompt group `g = e // G`.

    `stats="trajectory"` counts each scored episode once (paper formulas: Flow-GRPO Eq. 6, GiGPO Eq. 3);
    `stats="steps"` counts it once per step, as the official code does (each turn is a row of verl's batch and the
    group statistics run over rows: verl-agent `episode_norm_reward(compute_mean_std_cross_steps=True)`, AgentFlow
    `uid = data_id` over turn rows), so longer episodes weigh more and episodes without steps not at all.
    """
    n = episode_rewards.shape[0]
    valid_ep = ~torch.isnan(episode_rewards)
    if stats == "trajectory":
        weights = torch.ones(n, dtype=torch.float64)
    elif stats == "steps":
        weights = torch.bincount(steps.episode, minlength=n).double()
    else:
        raise ValueError(f"episode statistics must be 'trajectory' or 'steps', got {stats!r}.")
    groups = torch.arange(n) // group_size
    ep_adv, _ = segment_normalize(
        episode_rewards, groups, valid_ep & (weights > 0), weights=weights, scale=scale, unbiased=unbiased, eps=eps
    )
    return ep_adv[steps.episode]


# --- mapping to tokens ------------------------------------------------------------------------------------------


def turn_index_from_tool_mask(tool_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """`(N, T)` turn number of each completion token: 0 for the model's first turn, 1 for the turn after the first
    tool result, ...; −1 on tool-result tokens (`tool_mask == 0`) and padding (`completion_mask == 0`). A turn is a
    maximal run of model tokens, which is how TRL's `_tool_call_loop` lays out a multi-turn episode."""
    model = (tool_mask.bool() & completion_mask.bool()).long()
    prev = torch.nn.functional.pad(model, (1, 0))[:, :-1]
    starts = (model == 1) & (prev == 0)
    turn = torch.cumsum(starts.long(), dim=1) - 1
    return torch.where(model.bool(), turn, torch.full_like(turn, -1))


def step_to_token_advantages(
    step_adv: torch.Tensor, steps: StepBatch, turn_index: torch.Tensor, fallback: torch.Tensor | None = None
) -> torch.Tensor:
    """`(N, T)` per-token advantages: a token of turn `j` of episode `e` gets the advantage of the step of `e` with
    rank `j` (steps ordered by `index`). Tokens of a turn that has no step record (e.g. a final answer turn the
    environment never saw) get `fallback[e]` (default 0); tool-result and padding tokens get 0."""
    n, _ = turn_index.shape
    dense, _ = dense_by_episode(step_adv.float(), steps, n, fill=float("nan"))
    counts = torch.bincount(steps.episode, minlength=n)
    width = dense.shape[1]
    idx = turn_index.clamp(min=0, max=width - 1)
    tok = torch.gather(dense, 1, idx)
    has_step = (turn_index >= 0) & (turn_index < counts[:, None]) & ~torch.isnan(tok)
    fb = torch.zeros(n) if fallback is None else fallback.float()
    out = torch.where(has_step, tok, fb[:, None].expand_as(tok))
    return torch.where(turn_index >= 0, out, torch.zeros_like(out))
