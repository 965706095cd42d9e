"""Loop transcription of the official CCPO reward and advantage code, used as the reference by test_ccpo.py.

Read from bhai114/ccpo@ea50d3ae4f6f08affb6528b69b6f40f3493bb0c9:
CCPO/examples/gspo_trainer/two_model/two_model_trainer.py: `_verifier_outcome_from_reward` (l.1028–1063, the
fallback path: the summed token reward mapped to ±1), `_group_mean` (l.181–203), `_compute_counterfactual_role_rewards`
(l.1065–1105) and `_compute_grpo_like_advantage` (l.206–225) → CCPO/verl/trainer/ppo/core_algos.py
`compute_grpo_outcome_advantage` (l.478–545, robust mean off as in the run scripts). Same control flow, float32 torch
arithmetic, rows grouped by a prompt id; numpy/DataProto replaced by lists.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def verifier_outcome(raw: list[float]) -> torch.Tensor:
    r = torch.tensor(raw, dtype=torch.float32)
    return torch.where(r > 0, torch.ones_like(r), -torch.ones_like(r))


def group_mean(values: torch.Tensor, group_ids: list) -> torch.Tensor:
    sums, counts = {}, {}
    for i, gid in enumerate(group_ids):
        key = str(gid)
        if key not in sums:
            sums[key], counts[key] = torch.zeros((), dtype=values.dtype), 0
        sums[key] = sums[key] + values[i]
        counts[key] += 1
    return torch.stack([sums[str(gid)] / counts[str(gid)] for gid in group_ids])


def role_rewards(r_joint: torch.Tensor, r_solo: torch.Tensor, group_ids: list, lam: float = 0.2,
                 use_group_solo_baseline: bool = True, use_event_bonus: bool = True):
    """(r_thinker, r_solver) as `_compute_counterfactual_role_rewards` returns them."""
    baseline = group_mean(r_solo, group_ids) if use_group_solo_baseline else r_solo
    helped = ((r_joint > 0) & (baseline < 0)).float()
    hurt = ((r_joint < 0) & (baseline > 0)).float()
    bonus = helped - hurt if use_event_bonus else (r_joint - baseline) * 0.5
    return r_joint + lam * bonus, r_joint


def grpo_outcome_advantage(scores: torch.Tensor, index: list, norm_adv_by_std: bool = False,
                           epsilon: float = 1e-6) -> torch.Tensor:
    scores = scores.clone()
    id2score = defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(vals)
            id2mean[idx], id2std[idx] = torch.mean(stacked), torch.std(stacked)
    for i in range(scores.shape[0]):
        if norm_adv_by_std:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


def official_role_advantages(joint_raw: list[float], solo_raw: list[float], group_size: int, **kwargs):
    """(A_thinker, A_solver), `(N,)` each: what the official trainer puts on each role's tokens."""
    group_ids = [i // group_size for i in range(len(joint_raw))]
    r1, r2 = role_rewards(verifier_outcome(joint_raw), verifier_outcome(solo_raw), group_ids, **kwargs)
    return grpo_outcome_advantage(r1, group_ids), grpo_outcome_advantage(r2, group_ids)
