"""EFRame's pure parts: all-fail groups, the |A| selections on hand-derived GRPO advantages, the FIFO replay buffer
(bounds, order), the replay cadence and sample, and the config refusals."""

from __future__ import annotations

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages.group_norm import group_normalized_advantages
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.eframe import (
    add_to_buffer,
    all_fail_groups,
    buffer_size,
    eframe,
    replay_due,
    replay_indices,
    select_abs_above,
)


def test_all_fail_groups():
    rewards = torch.tensor([0.0, 0.0, 0.005, 0.0,   # all below eps 0.01: hard
                            0.0, 1.0, 0.0, 0.0,     # one success: not hard
                            -1.0, 0.0, float("nan"), 0.0,  # negative counts as fail, NaN ignored: hard
                            float("nan")] * 1 + [float("nan")] * 3)  # nothing scored: not hard
    assert all_fail_groups(rewards, 4, eps=0.01) == [0, 2]
    assert all_fail_groups(rewards, 4, eps=0.005) == [2]  # strict: 0.005 is not below 0.005
    assert all_fail_groups(rewards, 4, eps=0.0) == []  # 0 is not below 0
    # group size 1 and 2
    assert all_fail_groups(torch.tensor([0.0, 1.0]), 1) == [0]
    assert all_fail_groups(torch.tensor([0.0, 0.0, 0.0, 1.0]), 2) == [0]


def test_extra_group_selection_keeps_the_minority_outcome():
    # n = 5 binary rewards with k = 1 success: mean 0.2, unbiased std sqrt(0.2 * 0.8 * 5 / 4) = sqrt(0.2) = 0.44721;
    # success A = 0.8 / (0.44721 + 1e-4) = 1.7885 > 1, failures A = -0.2 / 0.44731 = -0.4471: only the success kept.
    adv = group_normalized_advantages(torch.tensor([1.0, 0, 0, 0, 0]), 5)
    assert adv[0].item() == pytest.approx(0.8 / (math.sqrt(0.2) + 1e-4), rel=1e-5)
    assert select_abs_above(adv, 1.0).tolist() == [True, False, False, False, False]
    # k = 4 of 5: the one failure (A = -1.7885) is kept, a negative row (official note)
    adv = group_normalized_advantages(torch.tensor([1.0, 1, 1, 1, 0]), 5)
    assert select_abs_above(adv, 1.0).tolist() == [False, False, False, False, True]
    assert adv[4].item() < -1
    # k = 2 of 4: |A| = 0.5 / (0.57735 + 1e-4) = 0.866 <= 1: nothing kept; k = 1 of 4: 0.75 / 0.5001 = 1.4997
    assert not select_abs_above(group_normalized_advantages(torch.tensor([1.0, 1, 0, 0]), 4), 1.0).any()
    assert select_abs_above(group_normalized_advantages(torch.tensor([1.0, 0, 0, 0]), 4), 1.0).tolist() == [
        True, False, False, False]


def test_filter_threshold_is_strict():
    adv = torch.tensor([0.0, 0.05, -0.05, 0.0501, -0.06, 1.0, float("nan")])
    assert select_abs_above(adv, 0.05).tolist() == [False, False, False, True, True, True, False]


def _rows(values):
    return {"prompt_ids": [torch.tensor([v]) for v in values], "completion_ids": [torch.tensor([v, v]) for v in values],
            "logps": [torch.tensor([-float(v), 0.0]) for v in values], "advantages": [float(v) for v in values]}


def test_buffer_is_fifo_and_bounded():
    state: dict = {}
    add_to_buffer(state, _rows([1, 2, 3]), capacity=4)
    assert buffer_size(state) == 3
    add_to_buffer(state, _rows([4, 5, 6]), capacity=4)  # 6 rows, newest 4 kept (official _truncate_to_capacity)
    assert state["buffer"]["advantages"] == [3.0, 4.0, 5.0, 6.0]
    assert [t.tolist() for t in state["buffer"]["completion_ids"]] == [[3, 3], [4, 4], [5, 5], [6, 6]]
    add_to_buffer(state, _rows([]), capacity=4)
    assert buffer_size(state) == 4
    add_to_buffer(state, _rows([7, 8, 9, 10, 11]), capacity=4)  # more than the capacity at once
    assert state["buffer"]["advantages"] == [8.0, 9.0, 10.0, 11.0]
    assert all(len(v) == 4 for v in state["buffer"].values())


def test_replay_cadence_and_sample():
    # every 5th generation batch once the buffer holds one batch (N = 8) of rows
    assert [b for b in range(1, 21) if replay_due(b, 5, 8, 8)] == [5, 10, 15, 20]
    assert not replay_due(5, 5, 7, 8)
    assert not replay_due(5, 0, 100, 8)  # replay off
    g = torch.Generator().manual_seed(0)
    assert replay_indices(16, 16, 8, g) == list(range(16))  # full: the whole buffer
    picked = replay_indices(13, 16, 4, torch.Generator().manual_seed(0))
    assert len(picked) == 12 and len(set(picked)) == 12 and picked == sorted(picked) and max(picked) < 13
    assert picked == replay_indices(13, 16, 4, torch.Generator().manual_seed(0))  # seeded: identical everywhere
    assert len(replay_indices(9, 16, 8, g)) == 8


def test_stage_keeps_everything_and_refuses_inf():
    batch = RolloutBatch(torch.tensor([0.0, 1.0, float("nan"), 0.0]), torch.ones(4), 2)
    assert eframe(batch, state={}).tolist() == [True] * 4
    with pytest.raises(ValueError, match="inf"):
        eframe(RolloutBatch(torch.tensor([0.0, float("inf")]), torch.ones(2), 2), state={})


@pytest.mark.parametrize("flag, value, match", [
    ("eframe_extra_n", 1, "eframe_extra_n"),
    ("eframe_extra_temperature", 0.0, "eframe_extra_temperature"),
    ("eframe_filter_threshold", -0.1, "eframe_filter_threshold"),
    ("eframe_replay_freq", -1, "eframe_replay_freq"),
    ("eframe_replay_size", 0.0, "eframe_replay_size"),
    ("beta", 0.01, "beta"),
    ("generation_temperatures", [1.0, 1.2], "generation_temperatures"),
    ("token_weighting", "gtpo_entropy", "token_weighting"),
    ("use_vllm", True, "use_vllm"),
])
def test_config_refusals(tmp_path, flag, value, match):
    with pytest.raises(ValueError, match=match):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), rollout_filter="eframe", num_generations=2,
                              per_device_train_batch_size=2, use_cpu=True, report_to="none", **{flag: value})
