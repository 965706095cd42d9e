"""Loop transcription of the official GraphGPO advantage, used as the reference of `test_graphgpo.py`.

Read from zzj1111/alfworldauto (langfengQ/verl-agent with recipe/GraphGPO) @37aec781da7f377874516e22d7f32c1932215eb4:
recipe/GraphGPO/core_graph.py (`ComplexGraph.from_data`, `all_to_target_shortest_paths`,
`compute_graph_path_returns`, `compute_graphgpo_outcome_advantage`) and recipe/GraphGPO/rollout_loop.py
(`gather_rollout_data`: the last step of an episode with reward > 0 leads to `'success'`). Same control flow (one
graph per task index, Dijkstra from the goal over reversed unit-weight edges, unreachable → max finite + 1, float32
returns), with numpy/DataProto replaced by lists; GiGPO's normalisations come from `step_credit_official`.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

import torch

from . import step_credit_official as official

GOAL = "success"


def rows_with_next_obs(states, episode_rewards, final_states, group_size):
    """verl-agent step rows plus `next_obs`: the next step's observation, `'success'` after the last step of an
    episode with reward > 0, else the episode's final observation."""
    rows = official.rows_from_episodes(states, [[0.0] * len(s) for s in states], episode_rewards, group_size)
    for r in rows:
        ep = states[r["traj"]]
        if r["t"] + 1 < len(ep):
            r["next_obs"] = ep[r["t"] + 1]
        else:
            r["next_obs"] = GOAL if episode_rewards[r["traj"]] > 0 else final_states[r["traj"]]
    return rows


def distances_to_goal(edges):
    reverse, nodes = defaultdict(list), set()
    for u, v in edges:
        reverse[v].append(u)
        nodes.update([u, v])
    dist = {x: float("inf") for x in nodes}
    dist[GOAL] = 0
    heap = [(0, GOAL)]
    while heap:
        cost, node = heapq.heappop(heap)
        if cost > dist[node]:
            continue
        for prev in reverse[node]:
            if cost + 1 < dist[prev]:
                dist[prev] = cost + 1
                heapq.heappush(heap, (cost + 1, prev))
    far = max([d for d in dist.values() if d != float("inf")] + [0])
    return {k: (far + 1 if d == float("inf") else d) for k, d in dist.items()}


def graph_returns(rows, gamma, normalize_distance=False):
    by_index = defaultdict(list)
    for r in rows:
        by_index[r["index"]].append((r["obs"], r["next_obs"]))
    dist = {idx: distances_to_goal(edges) for idx, edges in by_index.items()}
    out = []
    for r in rows:
        d = dist[r["index"]]
        exponent = d[r["next_obs"]] - d[r["obs"]] + 1 if normalize_distance else d[r["next_obs"]] + 1 - 1
        out.append(torch.tensor(10 * gamma ** exponent, dtype=torch.float32).item())
    return torch.tensor(out, dtype=torch.float32)


def graphgpo(rows, gamma=0.10, step_w=1.0, episode_w=1.0, mode="mean_std_norm", normalize_distance=False, eps=1e-6):
    remove_std = mode == "mean_norm"
    groups = [(r["index"], r["obs"]) for r in rows]
    step = official.step_norm(graph_returns(rows, gamma, normalize_distance), groups, eps, remove_std)
    episode = official.episode_norm(rows, eps, remove_std, cross_steps=True)
    return step_w * step + episode_w * episode
