"""Loop transcriptions of the official step-credit code, used as references by the step-credit unit tests.

Read from zzj1111/alfworldauto (langfengQ/verl-agent history) @20bd331bdbc9026a5668e11362178e10ab7400c8:
gigpo/core_gigpo.py (`compute_step_discounted_returns`, `episode_norm_reward`, `build_step_group`,
`step_norm_reward`, `compute_gigpo_outcome_advantage`) and recipe/hgpo/core_hgpo.py (`hgpo_advantage_estimate`,
`trajectory_advantages`); verl `core_algos.compute_grpo_outcome_advantage` as used by lupantech/AgentFlow@b9400643
(one row per turn, `uid = data_id`). Rows are verl-agent's step rows: one per (episode, step), in step-major order.
Same control flow and float32 torch arithmetic as the originals, with numpy/DataProto replaced by lists.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def rows_from_episodes(states, step_rewards, episode_rewards, group_size):
    """Step-major rows (all episodes' step 0, then step 1, ...) as verl-agent's rollout loop emits them."""
    rows = []
    longest = max(len(s) for s in states)
    for t in range(longest):
        for e, ep in enumerate(states):
            if t < len(ep):
                rows.append({"index": e // group_size, "traj": e, "t": t, "obs": ep[t], "reward": step_rewards[e][t],
                             "score": episode_rewards[e]})
    return rows


def discounted_returns(rows, gamma):
    out = [0.0] * len(rows)
    by_traj = defaultdict(list)
    for i, r in enumerate(rows):
        by_traj[r["traj"]].append(i)
    for idxs in by_traj.values():
        running = torch.tensor(0.0)
        for i in reversed(idxs):
            running = torch.tensor(rows[i]["reward"], dtype=torch.float32) + gamma * running
            out[i] = running.item()
    return torch.tensor(out, dtype=torch.float32)


def episode_norm(rows, eps=1e-6, remove_std=False, cross_steps=True):
    scores = torch.tensor([r["score"] for r in rows], dtype=torch.float32)
    id2score, seen = defaultdict(list), set()
    for i, r in enumerate(rows):
        if (r["index"], r["traj"]) in seen:
            continue
        id2score[r["index"]].append(scores[i])
        if not cross_steps:
            seen.add((r["index"], r["traj"]))
    mean, std = {}, {}
    for idx, vals in id2score.items():
        if len(vals) == 1:
            mean[idx], std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean[idx], std[idx] = torch.mean(torch.tensor(vals)), torch.std(torch.tensor([vals]))
    out = scores.clone()
    for i, r in enumerate(rows):
        m, s = mean[r["index"]], std[r["index"]]
        out[i] = scores[i] - m if remove_std else (scores[i] - m) / (s + eps)
    return out


def step_norm(values, groups, eps=1e-6, remove_std=False):
    id2score = defaultdict(list)
    for i, g in enumerate(groups):
        id2score[g].append(values[i])
    mean, std = {}, {}
    for g, vals in id2score.items():
        mean[g] = torch.mean(torch.tensor(vals))
        std[g] = torch.tensor(1.0) if len(vals) == 1 else torch.std(torch.tensor([vals]))
    out = values.clone()
    for i, g in enumerate(groups):
        out[i] = values[i] - mean[g] if remove_std else (values[i] - mean[g]) / (std[g] + eps)
    return out


def gigpo(rows, gamma=0.95, w=1.0, mode="mean_std_norm", eps=1e-6):
    remove_std = mode == "mean_norm"
    ep = episode_norm(rows, eps, remove_std, cross_steps=True)
    groups = [(r["index"], r["obs"]) for r in rows]  # build_step_group: exact obs match inside each index
    st = step_norm(discounted_returns(rows, gamma), groups, eps, remove_std)
    return ep + w * st


def hgpo(rows, gamma=0.95, history_length=2, mode="mean_std_norm", alpha=1.0, base_group=False, eps=1e-6):
    rewards = discounted_returns(rows, gamma)
    out = torch.zeros(len(rows))
    base = episode_norm(rows, eps, mode == "mean_norm", cross_steps=True) if base_group else None

    def aggregate(items):
        if not items:
            return torch.tensor(0.0)
        ks = torch.tensor([k for k, _ in items], dtype=torch.float32)
        advs = torch.stack([a.to(torch.float32) for _, a in items])
        valid = advs != 0
        if not valid.any():
            return torch.tensor(0.0)
        w_raw = (ks[valid] + 1) ** alpha
        w = w_raw / (w_raw.sum() + eps)
        return (w * advs[valid]).sum()

    for gid in sorted({r["index"] for r in rows}):
        members = [i for i, r in enumerate(rows) if r["index"] == gid]
        trajs = sorted({rows[i]["traj"] for i in members})
        traj_rows = {t: [i for i in members if rows[i]["traj"] == t] for t in trajs}  # row order = step order
        clusters = defaultdict(list)
        for t, idxs in traj_rows.items():
            obs = [rows[i]["obs"] for i in idxs]
            for si in range(len(idxs)):
                for k in range(1, min(history_length + 1, si + 1) + 1):
                    clusters[(k, tuple(obs[si - k + 1: si + 1]))].append((t, si))
        items = defaultdict(list)
        for (k, _), mem in clusters.items():
            if len(mem) <= 1:
                continue
            r = torch.stack([rewards[traj_rows[t][si]] for t, si in mem])
            mean, std = r.mean(), r.std(unbiased=False)
            a = (r - mean) / (std + eps) if mode == "mean_std_norm" else r - mean
            for j, (t, si) in enumerate(mem):
                items[(t, si)].append((k, a[j]))
        for t, idxs in traj_rows.items():
            for si, i in enumerate(idxs):
                its = items.get((t, si), [])
                if base_group:
                    its = [(0, base[i])] + its
                out[i] = aggregate(its)
    return out


def agentflow(rows, eps=1e-6):
    """verl compute_grpo_outcome_advantage over turn rows grouped by uid = data_id (norm_adv_by_std_in_grpo=True)."""
    return episode_norm(rows, eps, remove_std=False, cross_steps=True)


def ours_in_row_order(ours, steps, rows):
    """Our (S,) per-step output re-ordered to the official rows."""
    pos = {(int(e), int(i)): j for j, (e, i) in enumerate(zip(steps.episode, steps.index))}
    return torch.stack([ours[pos[(r["traj"], r["t"])]] for r in rows])
