"""EBPO's clustered sampling: the easy → hard order (hand-built pass rates, ties, unscored prompts), the seeded topic
clusters, serving the stream batch by batch, the stage's filter, config checks."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.ebpo_curriculum import (
    difficulty_order,
    ebpo_curriculum,
    ebpo_curriculum_select,
    topic_order,
)
from trl_groupx.sampling.prompt_sampler import selection_for

NAN = math.nan


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "ebpo_curriculum",
            "num_generations": 4, "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


def test_difficulty_order_is_easy_to_hard_keeping_every_prompt():
    # pass rates 1.0 (prompts 1, 4: ties in dataset order), 0.5 (3), 0.25 (0), 0.0 (5: kept), unscored (2) last
    assert difficulty_order(torch.tensor([0.25, 1.0, NAN, 0.5, 1.0, 0.0])) == [1, 4, 3, 0, 5, 2]
    assert difficulty_order(torch.tensor([0.5])) == [0]


def test_topic_order_clusters_are_contiguous_and_seeded():
    topics = ["alg", "geo", "alg", "calc", "geo", "alg"]
    # labels sorted: alg, calc, geo; NumPy permutation(3) seeded [0] = [2, 0, 1]: geo, alg, calc; within geo
    # (rows 1, 4) permutation(2) seeded [0, 2] = [0, 1]; within alg (rows 0, 2, 5) permutation(3) seeded [0, 0] =
    # [2, 0, 1] → 5, 0, 2; calc: 3
    assert topic_order(topics, 0) == [1, 4, 5, 0, 2, 3]
    other = topic_order(topics, 1)
    assert sorted(other) == list(range(6)) and other != topic_order(topics, 0)
    labels = [topics[i] for i in other]
    assert all(labels.index(t) + labels.count(t) - 1 == max(j for j, x in enumerate(labels) if x == t)
               for t in set(labels))  # each cluster is one contiguous run
    assert topic_order([3, 3, 3], 0) == topic_order(["3", "3", "3"], 0)  # labels compared as text


def test_select_walks_the_stream_and_wraps():
    assert selection_for("ebpo_curriculum") is ebpo_curriculum_select
    state = {"order": torch.tensor([4, 1, 3, 0, 2]), "served": 0}
    flags = {"seed": 0, "ebpo_curriculum_mode": "difficulty", "ebpo_curriculum_samples": 16,
             "ebpo_curriculum_success_threshold": 0.5, "ebpo_curriculum_topic_column": None}
    batches = [ebpo_curriculum_select(state, 2, 5, **flags) for _ in range(3)]
    assert batches == [[4, 1], [3, 0], [2, 4]] and state["served"] == 6
    with pytest.raises(ValueError, match="ordered 5 prompts but the train dataset has 6"):
        ebpo_curriculum_select(state, 2, 6, **flags)
    with pytest.raises(ValueError, match="must pass `trainer`"):
        ebpo_curriculum_select({}, 2, 5, **flags)


def test_filter_keeps_every_rollout_and_clears_pending():
    state = {"pending": torch.tensor([1, 2])}
    batch = RolloutBatch(torch.tensor([1.0, NAN, 0.0, 0.0]), torch.ones(4), group_size=2)
    assert ebpo_curriculum(batch, state=state).tolist() == [True] * 4 and state["pending"].numel() == 0
    with pytest.raises(ValueError, match="infinite reward"):
        ebpo_curriculum(RolloutBatch(torch.tensor([math.inf, 0.0]), torch.ones(2), 2), state={})


def test_registry_defaults_and_bad_flags_fail_at_construction():
    config = _config()
    assert (config.ebpo_curriculum_mode, config.ebpo_curriculum_samples) == ("difficulty", 16)  # the paper's
    assert _config(advantage_estimator="ebpo").active_variants() == {"sampling": "ebpo_curriculum",
                                                                       "advantages": "ebpo"}
    for flags, match in [
        ({"ebpo_curriculum_mode": "random"}, "ebpo_curriculum_mode='random': use 'difficulty'"),
        ({"ebpo_curriculum_samples": 0}, "ebpo_curriculum_samples=0: use an integer ≥ 1"),
        ({"ebpo_curriculum_samples": 2.0}, "ebpo_curriculum_samples=2.0"),
        ({"ebpo_curriculum_success_threshold": NAN}, "ebpo_curriculum_success_threshold=nan"),
        ({"ebpo_curriculum_mode": "topic"}, "set ebpo_curriculum_topic_column"),
    ]:
        with pytest.raises(ValueError, match=match):
            _config(**flags)
    assert _config(ebpo_curriculum_mode="topic", ebpo_curriculum_topic_column="topic").ebpo_curriculum_mode == "topic"
