"""Flow-GRPO (AgentFlow) per-step advantages: hand-derived numbers, the official (verl over turn rows) numbers,
and the edge cases."""

import pytest
import torch

from trl_groupx.advantages.agentflow import agentflow_step_advantages
from trl_groupx.advantages.group_norm import group_normalized_advantages
from trl_groupx.advantages.step_credit import StepBatch

from . import step_credit_official as official
from .step_credit_fixtures import random_episodes, shuffled

NAN, INF = float("nan"), float("inf")


def four_episodes():
    # G = 4, outcomes [1, 0, 0, 1], turns [1, 3, 1, 1]
    return StepBatch.from_lists([["a"], ["a", "b", "c"], ["a"], ["a"]]), torch.tensor([1.0, 0.0, 0.0, 1.0])


def test_catalog_check_broadcast_to_every_turn():
    steps, r = four_episodes()
    # trajectory statistics: mean .5, unbiased std sqrt(4·.25/3) = .57735 → ±.86603 on every turn of the episode
    a = agentflow_step_advantages(r, 4, steps)
    v = 0.5 / (3 ** -0.5 + 1e-6)
    torch.testing.assert_close(a, torch.tensor([v, -v, -v, -v, -v, v]))


def test_turn_weighted_statistics_official():
    steps, r = four_episodes()
    # rows [1 | 0 0 0 | 0 | 1]: mean 1/3, deviations 2/3 (×2), −1/3 (×4); ss = 8/9 + 4/9 = 4/3; unbiased var
    # (4/3)/5 = 4/15, std .516398 → 1: 1.290994, 0: −.645497
    a = agentflow_step_advantages(r, 4, steps, agentflow_episode_stats="steps")
    sd = (4 / 15) ** 0.5
    p, n = (2 / 3) / (sd + 1e-6), (-1 / 3) / (sd + 1e-6)
    torch.testing.assert_close(a, torch.tensor([p, n, n, n, n, p]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_official_code(seed):
    states, rewards, outcomes = random_episodes(seed)
    steps = shuffled(StepBatch.from_lists(states, rewards), seed)
    rows = official.rows_from_episodes(states, rewards, outcomes, 4)
    ours = agentflow_step_advantages(torch.tensor(outcomes), 4, steps, agentflow_episode_stats="steps")
    torch.testing.assert_close(official.ours_in_row_order(ours, steps, rows), official.agentflow(rows),
                               atol=2e-5, rtol=1e-5)


def test_trajectory_stats_equal_grpo_up_to_epsilon():
    torch.manual_seed(0)
    r = torch.rand(12)
    steps = StepBatch.from_lists([["s"] * (i % 3 + 1) for i in range(12)])
    a = agentflow_step_advantages(r, 4, steps)
    grpo = group_normalized_advantages(r, 4, scale_rewards="group")  # TRL's ε = 1e-4 vs 1e-6 here
    torch.testing.assert_close(a, grpo[steps.episode], atol=1e-3, rtol=1e-3)


def test_all_equal_group_sizes_nan_and_empty():
    steps = StepBatch.from_lists([["a"], ["b", "c"]])
    assert torch.equal(agentflow_step_advantages(torch.tensor([0.3, 0.3]), 2, steps), torch.zeros(3))
    assert torch.equal(agentflow_step_advantages(torch.tensor([1.0, 0.0]), 1, steps), torch.zeros(3))
    a = agentflow_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, agentflow_scale=False)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5]))
    steps3 = StepBatch.from_lists([["a"], ["b"], ["c"]])
    a = agentflow_step_advantages(torch.tensor([1.0, NAN, 0.0]), 3, steps3, agentflow_scale=False)
    torch.testing.assert_close(a, torch.tensor([0.5, 0.0, -0.5]))
    # an episode without steps still counts as a trajectory (trajectory stats) but not as rows (official stats)
    partial = StepBatch.from_lists([["a"], [], ["c"]])
    a = agentflow_step_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, partial, agentflow_scale=False)
    torch.testing.assert_close(a, torch.tensor([2 / 3, -1 / 3]))
    a = agentflow_step_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, partial, agentflow_scale=False,
                                  agentflow_episode_stats="steps")
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_and_bad_settings(bad):
    steps = StepBatch.from_lists([["a"], ["b"]])
    with pytest.raises(ValueError, match="advantage_estimator='agentflow'.*infinite"):
        agentflow_step_advantages(torch.tensor([bad, 0.0]), 2, steps)
    with pytest.raises(ValueError, match="agentflow_episode_stats"):
        agentflow_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, agentflow_episode_stats="rows")
