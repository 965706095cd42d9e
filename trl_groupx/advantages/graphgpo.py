"""GraphGPO (Graph-based Group Policy Optimization): the rollouts of a group merged into a state-transition graph,
step credit from the graph distance of the next state to the goal (catalog family Q, issue 8).

Dispatched with `advantage_estimator="graphgpo"` (requires `step_structure`: the trainer supplies `steps`, see
`trl_groupx.contracts`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import (
    NO_FINAL_STATE,
    VERL_EPS,
    StepBatch,
    check_steps,
    dense_by_episode,
    episode_advantages,
    segment_normalize,
)

GRAPHGPO_MODES = ("mean_std_norm", "mean_norm")
GRAPHGPO_EPISODE_STATS = ("trajectory", "steps")
# Official `compute_graph_path_returns`: the step return is 10·γ^d (a fixed scale; it cancels under mean_std_norm).
GRAPHGPO_GOAL_RETURN = 10.0
# Node keys that no observation hashes to (`state_key` is >= 0): the goal of each group, and one dead end per
# episode for a failed episode whose final observation is unknown (`-2 - e`).
_GOAL = -1


def _check_settings(gamma: float, mode: str, episode_stats: str) -> None:
    if mode not in GRAPHGPO_MODES:
        raise ValueError(f"graphgpo_mode must be one of {GRAPHGPO_MODES}, got {mode!r}.")
    if episode_stats not in GRAPHGPO_EPISODE_STATS:
        raise ValueError(f"graphgpo_episode_stats must be one of {GRAPHGPO_EPISODE_STATS}, got {episode_stats!r}.")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"graphgpo_gamma must lie in (0, 1] (official recipe 0.10), got {gamma}.")


def _validate(config) -> None:
    _check_settings(config.graphgpo_gamma, config.graphgpo_mode, config.graphgpo_episode_stats)


def next_state_keys(steps: StepBatch, num_episodes: int, success: torch.Tensor) -> torch.Tensor:
    """`(S,)` key of the state each step leads to: the next step's state inside the episode; after the last step the
    goal (`-1`) when the episode succeeded, else the episode's `final_state`, else a dead end of its own
    (`-2 - episode`: no path leads from it to the goal)."""
    dense, rank = dense_by_episode(steps.state, steps, num_episodes, fill=0)
    length = torch.bincount(steps.episode, minlength=num_episodes)
    is_last = rank == length[steps.episode] - 1
    nxt = dense[steps.episode, (rank + 1).clamp(max=dense.shape[1] - 1)]
    terminal = -2 - steps.episode
    if steps.final_state is not None:
        known = steps.final_state[steps.episode]
        terminal = torch.where(known != NO_FINAL_STATE, known, terminal)
    terminal = torch.where(success[steps.episode], torch.full_like(terminal, _GOAL), terminal)
    return torch.where(is_last, terminal, nxt)


def graph_distances(group: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, groups: torch.Tensor):
    """Distance-to-goal of the transition endpoints on each group's merged graph.

    The graph of group `g` has a node per distinct state key of `g` plus its goal node (key −1) and a directed
    edge `src → dst` per transition. `d(s)` is the number of edges of the shortest directed path from `s` to the
    goal (BFS from the goal over reversed edges, i.e. official Dijkstra with unit weights); a node with no path
    gets `max_g(finite d) + 1`, the maximum over the group's nodes including the goal (so a group without a
    success gets `d = 1` everywhere). Vectorised over groups: one relaxation per BFS level.

    Args:
        group, src, dst: `(S',)` the group id and the source / destination keys of each transition.
        groups: `(M,)` the group ids that get a goal node.

    Returns:
        `(d_src, d_dst)`: `(S',)` float64 distances of each transition's source and destination.
    """
    keys = torch.cat([torch.stack([group, src], 1), torch.stack([group, dst], 1),
                      torch.stack([groups, torch.full_like(groups, _GOAL)], 1)])
    uniq, node = torch.unique(keys, dim=0, return_inverse=True)
    k = src.numel()
    u, v, goal = node[:k], node[k: 2 * k], node[2 * k:]
    dist = torch.full((uniq.shape[0],), float("inf"), dtype=torch.float64)
    dist[goal] = 0.0
    for _ in range(uniq.shape[0]):  # BFS levels; the distances are final after at most (nodes − 1) levels
        relaxed = torch.full_like(dist, float("inf")).scatter_reduce_(0, u, dist[v] + 1.0, "amin")
        new = torch.minimum(dist, relaxed)
        if torch.equal(new, dist):
            break
        dist = new
    node_group = uniq[:, 0]
    _, gid = torch.unique(node_group, return_inverse=True)
    finite = torch.where(torch.isinf(dist), torch.full_like(dist, -1.0), dist)
    far = torch.full((int(gid.max()) + 1,), -1.0, dtype=torch.float64).scatter_reduce_(0, gid, finite, "amax")
    dist = torch.where(torch.isinf(dist), far[gid] + 1.0, dist)
    return dist[u], dist[v]


@register(
    "graphgpo",
    name="GraphGPO (Graph-based Group Policy Optimization)",
    paper="Beyond Trajectory-Level Attribution: Graph-Based Credit Assignment for Agentic Reinforcement Learning, "
          "arXiv:2605.26684",
    official_code="zzj1111/alfworldauto@37aec781da7f377874516e22d7f32c1932215eb4:recipe/GraphGPO/core_graph.py",
    stage="advantages",
    requires=("step_structure",),
    needs=("multi-turn rollouts with comparable states: rollout_func fields step_states (optional step_final_state) "
           "or an environment with _step_structure()",),
    params=("graphgpo_gamma", "graphgpo_step_advantage_w", "graphgpo_episode_advantage_w", "graphgpo_mode",
            "graphgpo_episode_stats", "graphgpo_normalize_distance", "graphgpo_success_threshold"),
    validate=_validate,
)
def graphgpo_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    graphgpo_gamma: float = 0.10,
    graphgpo_step_advantage_w: float = 1.0,
    graphgpo_episode_advantage_w: float = 1.0,
    graphgpo_mode: str = "mean_std_norm",
    graphgpo_episode_stats: str = "trajectory",
    graphgpo_normalize_distance: bool = False,
    graphgpo_success_threshold: float = 0.0,
) -> torch.Tensor:
    """GraphGPO per-step advantages `A_t = ω_S·A^S_t + ω_E·A^E_e`:

        graph of group g: nodes = states of g's episodes + goal, edges s_t → s'_t (one per step)
        d(s)     = BFS distance from s to the goal; unreachable → max_g(finite d) + 1
        R_t      = 10·γ^{d(s'_t)}                     (`graphgpo_normalize_distance`: 10·γ^{d(s'_t) − d(s_t) + 1})
        A^S_t    = (R_t − mean_{U(t)} R) / (std_{U(t)} R + ε)   U(t) = steps of g acting on the same state as t
        A^E_e    = (R_e − mean_g R) / (std_g R + ε)               episode level, as GiGPO

    std is unbiased (`torch.std`), ε = 1e-6; `graphgpo_mode="mean_norm"` drops both std divisions. A state that
    occurs once in its group (a singleton `U(t)`) gets `A^S = 0`, as does a group whose `R` are all equal.

    The next state `s'_t` of a step is the state of the following step of its episode. After an episode's last step
    it is the goal when the episode succeeded (`R_e > graphgpo_success_threshold`), else the observation the
    rollout reported as `step_final_state` (`StepBatch.final_state`), else a dead end of that episode alone.

    Paper: arXiv:2605.26684 (its abstract and the official recipe's README were read, not the full text: the
    formulas here follow the official code). Official code: zzj1111/alfworldauto (a fork carrying
    langfengQ/verl-agent's history with recipe/GraphGPO) @37aec781da7f377874516e22d7f32c1932215eb4: recipe/GraphGPO/core_graph.py `ComplexGraph.from_data`
    (l. 148-197: one graph per task uid, an edge `anchor_obs → next_obs` per step, goal node `'success'`),
    `all_to_target_shortest_paths` (l. 285-324: Dijkstra from the goal over reversed unit-weight edges;
    unreachable → max finite distance + 1), `compute_graph_path_returns` (l. 774-837: `10·γ^{d(next) + w − 1}`
    with edge weight w = 1, or `10·γ^{d(next) − d(anchor) + w}` with `normalize_distance`),
    `compute_graphgpo_outcome_advantage` (l. 841-903: GiGPO's `build_step_group` / `step_norm_reward` on these
    returns + `episode_advantage_w`·`episode_norm_reward`); recipe/GraphGPO/rollout_loop.py `gather_rollout_data`
    (l. 283-292: the last step of an episode with `episode_rewards > 0` gets `next_obs = 'success'`, a failed one
    keeps the environment's next observation); config/graphgpo_trainer.yaml (γ = 0.10, both weights 1.0,
    `mean_std_norm`, `normalize_distance: False`, exact-match states); gigpo/core_gigpo.py (same commit)
    `episode_norm_reward` (l. 174-240, `compute_mean_std_cross_steps=True` default) and `step_norm_reward`
    (l. 334-385: a single-member group has std 1 and its own mean, so advantage 0).

    Choices:
        * `graphgpo_episode_stats="trajectory"` (default; GraphGPO's episode term is GiGPO's, and `gigpo` here
          follows GiGPO's Eq. 3): each episode counts once. `"steps"` reproduces the official default
          (statistics over step rows); with it our numbers equal the official code's.
        * Success = `R_e > graphgpo_success_threshold` (official: `episode_rewards > 0`).
        * The last transition of a failed episode: the trainer supplies the observation after the last action
          only when the rollout returns a `step_final_state` field; otherwise that transition ends in a dead end
          of its own (distance max + 1), which is what the official graph gives whenever the final observation
          appears nowhere else on a path to the goal.
        * NaN episode reward: its success is unknown, so its transitions are left out of the graph and of every
          statistic, and its steps get 0. Step rewards are not read (the graph return replaces them).
        * Deliberate differences from the official code: an episode group with fewer than 2 scored entries gives
          0 at the episode level (official: the raw reward); a group whose values are all equal gives exactly 0;
          similarity-based state merging (`enable_similarity`) is not implemented (exact state keys).

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` episode outcomes, `N/G` contiguous groups of `G`.
        group_size (`int`): `G`.
        steps (`StepBatch`): the `S` steps (episode, index, state key; optional per-episode final state).

    Returns:
        `torch.Tensor`: `(S,)` per-step advantages.
    """
    flag = "advantage_estimator='graphgpo'"
    check_steps(episode_rewards, group_size, steps, flag)
    _check_settings(graphgpo_gamma, graphgpo_mode, graphgpo_episode_stats)
    scale = graphgpo_mode == "mean_std_norm"
    n = episode_rewards.shape[0]
    valid_ep = ~torch.isnan(episode_rewards)
    step_valid = valid_ep[steps.episode]
    if not step_valid.any():
        return torch.zeros(steps.num_steps)

    success = valid_ep & (episode_rewards > graphgpo_success_threshold)
    nxt = next_state_keys(steps, n, success)
    group = steps.episode // group_size
    d_src, d_dst = graph_distances(group[step_valid], steps.state[step_valid], nxt[step_valid],
                                   torch.unique(group[step_valid]))
    exponent = d_dst - d_src + 1.0 if graphgpo_normalize_distance else d_dst
    returns = torch.zeros(steps.num_steps, dtype=torch.float64)
    returns[step_valid] = GRAPHGPO_GOAL_RETURN * torch.pow(torch.tensor(graphgpo_gamma, dtype=torch.float64),
                                                           exponent)

    pair = torch.stack([group, steps.state], dim=1)
    _, segments = torch.unique(pair, dim=0, return_inverse=True)
    step_adv, _ = segment_normalize(returns, segments, step_valid, scale=scale, unbiased=True, eps=VERL_EPS)
    ep_adv = episode_advantages(episode_rewards, group_size, steps, stats=graphgpo_episode_stats, scale=scale,
                                unbiased=True, eps=VERL_EPS)
    adv = graphgpo_step_advantage_w * step_adv.double() + graphgpo_episode_advantage_w * ep_adv.double()
    return torch.where(step_valid, adv, torch.zeros_like(adv)).to(torch.float32)
