"""EBPO's clustered sampling (`rollout_filter="ebpo_curriculum"`): the training stream ordered easy → hard by the base
model's pass rate ("EBPO-diff"), or grouped into topic clusters ("EBPO-topic"), so that EBPO's online global prior
(`advantage_estimator="ebpo"`) tracks a coherent local distribution.

Served through the prompt-selection seam (`prompt_sampler.py`) as sGPO's curriculum is, and with sGPO's profiling
pass (`sgpo.profile_success_rates`): the order is built at the first training generation, kept in the variant's
state (checkpointed), and every generation batch takes the next prompts of it.
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
from .sgpo import profile_success_rates

VARIANT_ID = "ebpo_curriculum"
MODES = ("difficulty", "topic")


def _validate(config: Any) -> None:
    mode = config.ebpo_curriculum_mode
    if mode not in MODES:
        raise ValueError(f"ebpo_curriculum_mode={mode!r}: use 'difficulty' (EBPO-diff: easy → hard by the base model's "
                         "pass rate) or 'topic' (EBPO-topic: prompts grouped by ebpo_curriculum_topic_column).")
    n = config.ebpo_curriculum_samples
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"ebpo_curriculum_samples={n!r}: use an integer ≥ 1, the rollouts per prompt that measure its "
                         "pass rate (the paper: 16).")
    t = config.ebpo_curriculum_success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"ebpo_curriculum_success_threshold={t!r}: use a finite reward above which a profiling "
                         "rollout counts as correct (0.5 for 0/1 accuracy rewards).")
    column = config.ebpo_curriculum_topic_column
    if mode == "topic" and (not isinstance(column, str) or not column):
        raise ValueError("ebpo_curriculum_mode='topic' groups prompts by a dataset column: set "
                         "ebpo_curriculum_topic_column to the column holding each prompt's topic label.")
    if mode == "difficulty" and getattr(config, "use_vllm", False):
        raise ValueError("ebpo_curriculum_mode='difficulty' profiles the prompts with the trainer's transformers "
                         "generator; it does not run with use_vllm=True yet. Set use_vllm=False, or use 'topic'.")


def difficulty_order(pass_rates: torch.Tensor) -> list[int]:
    """Dataset indices easy → hard: decreasing pass rate, ties in dataset order, unscored prompts (NaN) last. Every
    prompt is kept (EBPO re-ranks the dataset; it filters nothing)."""
    p = pass_rates.double()
    key = torch.where(torch.isnan(p), torch.full_like(p, math.inf), -p)
    return torch.sort(key, stable=True).indices.tolist()


def topic_order(topics: list[Any], seed: int) -> list[int]:
    """Dataset indices in topic clusters: the clusters (distinct labels) in a NumPy permutation seeded `[seed]`,
    each cluster's prompts in one seeded `[seed, k]` (k: the cluster's rank in sorted label order), so that every
    process and every resumed run builds the same stream."""
    labels = sorted({str(t) for t in topics})
    members = {label: [i for i, t in enumerate(topics) if str(t) == label] for label in labels}
    order: list[int] = []
    for c in np.random.default_rng([int(seed)]).permutation(len(labels)).tolist():
        rows = members[labels[c]]
        order += [rows[j] for j in np.random.default_rng([int(seed), c]).permutation(len(rows)).tolist()]
    return order


@prompt_selection(VARIANT_ID)
def ebpo_curriculum_select(state: dict, num_prompts: int, dataset_size: int, trainer: Any = None, *, seed: int,
                           ebpo_curriculum_mode: str, ebpo_curriculum_samples: int,
                           ebpo_curriculum_success_threshold: float, ebpo_curriculum_topic_column: str | None
                           ) -> list[int]:
    """The next `num_prompts` prompts of the stream (wrapping to its start). Builds the stream on the first call
    (state empty): profiling pass (difficulty) or the topic column (topic)."""
    if "order" not in state:
        if trainer is None:
            raise ValueError(f"rollout_filter={VARIANT_ID!r} reads the train dataset: the seam must pass `trainer`.")
        dataset = trainer.train_dataset
        if ebpo_curriculum_mode == "difficulty":
            p_hat = profile_success_rates(trainer, dataset, ebpo_curriculum_samples,
                                          ebpo_curriculum_success_threshold, VARIANT_ID)
            state["pass_rate"] = p_hat
            order = difficulty_order(p_hat)
            trainer._metrics["train"]["groupx/ebpo_curriculum_mean_pass_rate"].append(float(p_hat.nanmean()))
        else:
            order = topic_order(list(dataset[ebpo_curriculum_topic_column]), seed)
        state.update(order=torch.tensor(order, dtype=torch.int64), served=0)
    order = state["order"]
    if order.numel() != dataset_size:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} ordered {order.numel()} prompts but the train dataset has "
                         f"{dataset_size}; resume with the dataset the checkpoint was trained on.")
    served = int(state["served"])
    chosen = [int(order[(served + j) % order.numel()]) for j in range(num_prompts)]
    state["served"] = served + num_prompts
    if trainer is not None and "pass_rate" in state:
        trainer._metrics["train"]["groupx/ebpo_curriculum_batch_pass_rate"].append(
            float(state["pass_rate"][chosen].nanmean()))
    return chosen


@register(
    VARIANT_ID,
    name="EBPO clustered sampling (difficulty curriculum or topic clusters)",
    paper="EBPO: Empirical Bayes Shrinkage for Stabilizing Group-Relative Policy Optimization, arXiv:2602.05165",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "ebpo_curriculum_mode": "difficulty", "ebpo_curriculum_samples": 16,
           "ebpo_curriculum_success_threshold": 0.5, "ebpo_curriculum_topic_column": None},
    params=("ebpo_curriculum_mode", "ebpo_curriculum_samples", "ebpo_curriculum_success_threshold",
            "ebpo_curriculum_topic_column"),
    stateful=True,
    validate=_validate,
)
def ebpo_curriculum(batch: RolloutBatch, *, state: dict) -> torch.Tensor:
    r"""EBPO's clustered sampling: the order of the training stream, for EBPO's online prior.

    Source: arXiv:2602.05165 (no official code), §3 "Optimizing Prior Estimation via Clustered Sampling", §4
    "Clustered Sampling Details" and "Curriculum Learning with Difficulty Clustering", Appendix "Hyperparameter
    Details" (read from the paper's TeX):

    - `ebpo_curriculum_mode="difficulty"` (EBPO-diff): "we perform sixteen independent rollouts per prompt using a
      sampling temperature of T = 1.0. The difficulty metric for each question is defined as the empirical pass
      rate"; "a dataset re-ranked from easy to hard difficulty", trained "for a single epoch without data shuffling".
      Here: one profiling pass at the first training generation (the policy is still the base model), `S =
      ebpo_curriculum_samples` (16) completions per prompt from TRL's generator at the run's sampling settings (set
      `temperature: 1.0` for the paper's), scored by the run's reward functions (weighted sum); pass rate =
      `#{r > ebpo_curriculum_success_threshold} / #scored` (**choice**: 0.5, for 0/1 accuracy rewards); order:
      decreasing pass rate, ties in dataset order, unscored prompts last (`difficulty_order`). Nothing is filtered.
    - `ebpo_curriculum_mode="topic"` (EBPO-topic): "Grouping prompts by mathematical domain"; the paper labels each
      question with one of nine domains by GPT-4.1. Here the labels come from the dataset column
      `ebpo_curriculum_topic_column`; **choice** (the paper gives no order): clusters in a seeded random order, each
      cluster's prompts in a seeded random order (`topic_order`), one cluster after the other.
    - Serving: generation batch `t` takes stream positions `t·B … t·B + B − 1` (`B` prompts per generation batch);
      **choice**: after the last prompt the stream restarts from its first (the paper trains one epoch: set
      `num_train_epochs: 1` or `max_steps` accordingly).

    Pair it with `advantage_estimator="ebpo"` (the paper's setting; `recipes/ebpo_diff.yaml`). This function is the
    stage's filter: it keeps every rollout.

    State (checkpointed: a resumed run neither re-profiles nor moves in the stream): `order` `(M,)` int64 dataset
    indices, `served` (prompts handed out), `pass_rate` `(M,)` float64 (difficulty mode), `pending` (the seam's
    record of the batch's prompts; cleared here).

    Args:
        batch (`RolloutBatch`): the global generation batch.
        state (`dict`): see above.

    Returns:
        `torch.Tensor`: `(N,)` bool, all `True`.
    """
    keep = keep_all(batch, VARIANT_ID)
    state["pending"] = torch.zeros(0, dtype=torch.int64)
    return keep
