"""Loop transcription of the official mmGRPO grouping and advantages, the reference of the mmgrpo unit tests.

Read from stanfordnlp/dspy@4ed377ee9110e912d4f5e1be43b317b87455053c:dspy/teleprompt/grpo.py `GRPO.compile`
l.408–508 (per predictor, per example: each rollout's calls of the predictor, `min_len`/`max_len`, `truncate` or
`ragged`, group j = the j-th call of every rollout, reward = the rollout's score) and
Ziems/arbor@2c1b9041b330113e831a9dcf897e5126fc4259a5:arbor/training/grpo/trainer.py `_compute_advantages`
(l.1213–1230: contiguous groups of `num_generations` rows, float32 `r − mean`, `/ (std + 1e-4)` if `scale_rewards`).
Same control flow; dspy's traces and Arbor's broadcast batch replaced by lists. Every rollout is present (dspy drops
a rollout only when the program crashes, which these fixtures never do), so the l.540–547 padding never runs.
"""

from __future__ import annotations

import torch


def dspy_groups(calls: list[list[str]], scores: list[float], num_rollouts: int, mode: str = "truncate"):
    """The GRPO groups dspy builds: a list of groups, each a list of `(episode, module, j, reward)` entries.
    `calls[e]` is the module of each LM call of rollout `e`, in trace order; rollouts of one example are
    contiguous, `num_rollouts` of them."""
    predictors = sorted({m for ep in calls for m in ep})
    groups = []
    for pred in predictors:
        for example in range(len(calls) // num_rollouts):
            invocations = []
            for k in range(num_rollouts):
                e = example * num_rollouts + k
                mine = [i for i, m in enumerate(calls[e]) if m == pred]
                invocations.append([(e, pred, j, scores[e]) for j in range(len(mine))])
            min_len = min(len(inv) for inv in invocations)
            if min_len == 0:  # some rollout never called this predictor: the example is skipped for it
                continue
            if mode == "truncate":
                invocations = [inv[:min_len] for inv in invocations]
            else:
                assert mode == "ragged"
            max_len = max(len(inv) for inv in invocations)
            example_groups = [[] for _ in range(max_len)]
            for group_idx in range(max_len):
                for rollout_idx in range(len(invocations)):
                    example_groups[group_idx].append(invocations[rollout_idx][group_idx])  # IndexError if ragged
            groups.extend(example_groups)
    return groups


def arbor_advantages(groups, num_generations: int, scale_rewards: bool = False) -> dict:
    """Arbor's advantages of the flattened groups, keyed by `(episode, module, j)`."""
    entries = [entry for group in groups for entry in group]
    if not entries:
        return {}
    rewards = torch.tensor([entry[3] for entry in entries])
    mean_grouped = rewards.view(-1, num_generations).mean(dim=1).repeat_interleave(num_generations, dim=0)
    std_grouped = rewards.view(-1, num_generations).std(dim=1).repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped
    if scale_rewards:
        advantages = advantages / (std_grouped + 1e-4)
    return {entry[:3]: float(a) for entry, a in zip(entries, advantages)}
