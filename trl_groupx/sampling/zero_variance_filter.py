"""Zero-variance group filter: DAPO dynamic sampling without the refill (peer extra, verl's `filter_groups`)."""

from __future__ import annotations

import torch

from ..contracts import RolloutBatch
from ..registry import register


@register(
    "zero_variance_filter",
    name="Zero-variance group filter (DAPO dynamic sampling, no refill)",
    paper="DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv:2503.14476",
    official_code="verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3:dapo/dapo_ray_trainer.py",
    stage="sampling",
)
def zero_variance_filter(batch: RolloutBatch) -> torch.Tensor:
    r"""Drop every rollout of a group whose scored rewards are all equal (`max_g r = min_g r`).

    `keep_i = [max_{j∈g(i), scored} r_j > min_{j∈g(i), scored} r_j]` for `G > 1`; shapes `(N,)` in, `(N,)` bool
    out. Such groups have zero group-relative advantage under GRPO, so they only dilute the batch (and, with
    token-sum normalisers, shrink the update); DAPO's dynamic sampling removes them (paper §3.2 "Dynamic
    Sampling": the constraint `0 < |{o_i : is_equivalent(a, o_i)}| < G` of the DAPO objective).

    Reference: verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3:dapo/dapo_ray_trainer.py,
    `RayDAPOTrainer.fit`, l.250-271 (keep a prompt's trajectories iff `np.std(group metric) > 0` or the group has
    one trajectory).

    What is NOT done — the refill: DAPO (and verl) keep generating new batches, concatenating the surviving groups
    until `train_batch_size` prompts are collected, then truncate. Here the batch SHRINKS instead: dropped
    rollouts keep their slots with completion mask 0 and advantage 0 and leave `num_items_in_batch`. TRL's
    generation is driven by its `RepeatSampler`/dataloader, which fixes the number of prompts per generation batch
    and their split across processes and gradient-accumulation slices before generation; a post-generation filter
    cannot draw more prompts from it. So the effective batch varies from step to step (logged as
    `groupx/kept_fraction`), and the loss normaliser counts the kept tokens only. For DAPO's refill (new prompts
    generated until the batch is full), use `rollout_filter="dapo_dynamic_sampling"`.

    Choices: the statistic is the trainer's weighted reward sum (verl's default metric is `acc`, or the sequence
    reward); equality is exact (`std > 0` in verl), no tolerance. NaN rewards (unscored) are ignored for the test:
    a group is kept iff its scored rewards differ, and its unscored rollouts are then dropped anyway (the
    advantage stage gives them 0). A group with at most one scored rollout (including all-NaN) is dropped.
    `G = 1`: every scored rollout is kept, as verl keeps single-trajectory groups (no variance to test). ±inf
    rewards raise `ValueError`. Note: if every group is dropped the step trains nothing (all masks 0).

    Args:
        batch (`RolloutBatch`): global rewards and group size (completion lengths unused).

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask.
    """
    rewards, g = batch.rewards, batch.group_size
    if torch.isinf(rewards).any():
        raise ValueError(
            "rollout_filter='zero_variance_filter' got ±inf rewards; reward functions must return finite values "
            "or NaN."
        )
    scored = ~torch.isnan(rewards)
    if g == 1:
        return scored
    r = rewards.view(-1, g)
    hi = torch.where(scored.view(-1, g), r, -torch.inf).max(1).values
    lo = torch.where(scored.view(-1, g), r, torch.inf).min(1).values
    mixed = hi > lo  # False for all-equal groups and for groups with < 2 scored rollouts (hi = -inf or hi = lo)
    return mixed.repeat_interleave(g) & scored
