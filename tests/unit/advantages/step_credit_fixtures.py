"""Random multi-turn fixtures for the step-credit tests (shared states inside a group, so groups form)."""

from __future__ import annotations

import random

import torch

from trl_groupx.advantages.step_credit import StepBatch


def random_episodes(seed, n_groups=3, group_size=4, alphabet=3, max_len=5, binary=False):
    rng = random.Random(seed)
    states, rewards, outcomes = [], [], []
    for g in range(n_groups):
        for _ in range(group_size):
            length = rng.randint(1, max_len)
            ep = [f"g{g}-start"] + [f"s{rng.randrange(alphabet)}" for _ in range(length - 1)]
            states.append(ep)
            if binary:
                rewards.append([0.0] * (length - 1) + [float(rng.random() < 0.5)])
            else:
                rewards.append([round(rng.uniform(-1, 2), 3) if rng.random() < 0.6 else 0.0 for _ in range(length)])
            outcomes.append(sum(rewards[-1]) if binary else round(rng.uniform(0, 1), 3))
    return states, rewards, outcomes


def shuffled(steps: StepBatch, seed: int) -> StepBatch:
    perm = torch.randperm(steps.num_steps, generator=torch.Generator().manual_seed(seed))
    return StepBatch(steps.episode[perm], steps.index[perm], steps.state[perm], steps.reward[perm])
