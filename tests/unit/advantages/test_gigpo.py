"""GiGPO per-step advantages: hand-derived numbers, the official verl-agent numbers, and the edge cases."""

import pytest
import torch

from trl_groupx.advantages.gigpo import gigpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch

from . import step_credit_official as official
from .step_credit_fixtures import random_episodes, shuffled

NAN, INF = float("nan"), float("inf")
SQ2 = 2 ** 0.5


def two_episodes():
    # episode 0: states A → B, step rewards [0, 1], outcome 1;  episode 1: A → C, [0, 0], outcome 0;  G = 2
    return StepBatch.from_lists([["A", "B"], ["A", "C"]], [[0, 1], [0, 0]]), torch.tensor([1.0, 0.0])


def test_hand_values_mean_norm():
    steps, r = two_episodes()
    # episode level: mean 0.5 → +0.5 / −0.5.  Returns with γ = 0.5: ep0 [0 + .5·1, 1] = [.5, 1], ep1 [0, 0].
    # anchor groups: A = {ep0 t0: .5, ep1 t0: 0} → ±.25; B and C are singletons → 0.
    a = gigpo_step_advantages(r, 2, steps, gigpo_gamma=0.5, gigpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([0.75, 0.5, -0.75, -0.5]))


def test_hand_values_mean_std_norm_and_weight():
    steps, r = two_episodes()
    # episode: ±.5 / std([1, 0]) = ±.5/.70711 = ±.70711; step A: ±.25 / std([.5, 0]) = ±.25/.35355 = ±.70711
    a = gigpo_step_advantages(r, 2, steps, gigpo_gamma=0.5)
    torch.testing.assert_close(a, torch.tensor([SQ2, SQ2 / 2, -SQ2, -SQ2 / 2]), atol=1e-5, rtol=0)
    # ω = 0 is episode-level GRPO broadcast to every step
    a0 = gigpo_step_advantages(r, 2, steps, gigpo_gamma=0.5, gigpo_step_advantage_w=0.0)
    torch.testing.assert_close(a0, torch.tensor([SQ2 / 2, SQ2 / 2, -SQ2 / 2, -SQ2 / 2]), atol=1e-5, rtol=0)


def test_catalog_check_same_state_actions_get_plus_minus():
    # two trajectories visit state s; the action there returns 1 in one and 0 in the other → ± step advantage at s
    steps = StepBatch.from_lists([["s0", "s"], ["s0", "s"]], [[0, 1], [0, 0]])
    a = gigpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, gigpo_gamma=1.0, gigpo_mode="mean_norm")
    # episode ±.5; returns: ep0 [1, 1], ep1 [0, 0]; groups s0 and s both {1, 0} → ±.5 → combined ±1 everywhere
    torch.testing.assert_close(a, torch.tensor([1.0, 1.0, -1.0, -1.0]))


@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_official_code(mode, seed):
    states, rewards, outcomes = random_episodes(seed)
    steps = StepBatch.from_lists(states, rewards)
    rows = official.rows_from_episodes(states, rewards, outcomes, 4)
    ref = official.gigpo(rows, gamma=0.95, w=1.0, mode=mode)
    ours = gigpo_step_advantages(torch.tensor(outcomes), 4, shuffled(steps, seed), gigpo_gamma=0.95,
                                 gigpo_mode=mode, gigpo_episode_stats="steps")
    torch.testing.assert_close(official.ours_in_row_order(ours, shuffled(steps, seed), rows), ref,
                               atol=2e-5, rtol=1e-5)


def test_trajectory_stats_count_each_episode_once():
    # episode 0 has 3 steps, episode 1 one step: "trajectory" → ±.5 / .70711; "steps" weighs ep0 three times:
    # rows [1, 1, 1, 0]: mean .75, unbiased std .5 → ep0 .25/.5 = .5, ep1 −.75/.5 = −1.5
    steps = StepBatch.from_lists([["a", "b", "c"], ["x"]])
    r = torch.tensor([1.0, 0.0])
    a_t = gigpo_step_advantages(r, 2, steps, gigpo_step_advantage_w=0.0)
    a_s = gigpo_step_advantages(r, 2, steps, gigpo_step_advantage_w=0.0, gigpo_episode_stats="steps")
    torch.testing.assert_close(a_t, torch.tensor([SQ2 / 2] * 3 + [-SQ2 / 2]), atol=1e-5, rtol=0)
    torch.testing.assert_close(a_s, torch.tensor([0.5, 0.5, 0.5, -1.5]), atol=1e-5, rtol=0)


def test_groups_are_per_prompt():
    # the same state in two different prompt groups never shares a step group
    steps = StepBatch.from_lists([["s"], ["s"], ["s"], ["s"]], [[1], [0], [5], [5]])
    a = gigpo_step_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, steps, gigpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_all_equal_group_size_one_and_two():
    steps = StepBatch.from_lists([["a", "b"], ["a", "b"]], [[0, 0.1], [0, 0.1]])
    assert torch.equal(gigpo_step_advantages(torch.tensor([0.1, 0.1]), 2, steps), torch.zeros(4))
    # G = 1: every group is a singleton → 0 (official would give the raw outcome at the episode level)
    steps1 = StepBatch.from_lists([["a"], ["b"]], [[1], [0]])
    assert torch.equal(gigpo_step_advantages(torch.tensor([1.0, 0.0]), 1, steps1), torch.zeros(2))


def test_nan_episode_excluded_and_zero():
    # ep1 unscored: left out of both levels; ep0 vs ep2: episode ±.5 (mean_norm); step groups A = {ep0, ep2}
    steps = StepBatch.from_lists([["A"], ["A"], ["A"], ["B"]], [[1], [7], [0], [0]])
    a = gigpo_step_advantages(torch.tensor([1.0, NAN, 0.0, 0.0]), 4, steps, gigpo_mode="mean_norm")
    # episode mean over {1, 0, 0} = 1/3 → ep0 2/3, ep2 −1/3, ep3 −1/3; step A over {1, 0}: ±.5; B singleton 0
    torch.testing.assert_close(a, torch.tensor([2 / 3 + 0.5, 0.0, -1 / 3 - 0.5, -1 / 3]))


def test_nan_step_reward_drops_that_return_only():
    # ep0 step 1 reward NaN → returns of ep0 t0 and t1 NaN: left out of step groups, A^S = 0 there
    steps = StepBatch.from_lists([["A", "B"], ["A", "B"]], [[0, NAN], [0, 1]])
    a = gigpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, gigpo_mode="mean_norm", gigpo_gamma=1.0)
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, -0.5, -0.5]))


def test_empty_steps_and_episode_without_steps():
    empty = StepBatch.from_lists([[], []])
    assert gigpo_step_advantages(torch.tensor([1.0, 0.0]), 2, empty).shape == (0,)
    steps = StepBatch.from_lists([["a"], []], [[1], []])  # a truncated episode that recorded no step
    a = gigpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, gigpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([0.5]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_rewards_name_the_flag(bad):
    steps = StepBatch.from_lists([["a"], ["b"]], [[0], [bad]])
    with pytest.raises(ValueError, match="advantage_estimator='gigpo'.*infinite"):
        gigpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps)
    with pytest.raises(ValueError, match="advantage_estimator='gigpo'.*infinite"):
        gigpo_step_advantages(torch.tensor([bad, 0.0]), 2, StepBatch.from_lists([["a"], ["b"]]))


def test_bad_settings_and_shapes():
    steps, r = two_episodes()
    with pytest.raises(ValueError, match="gigpo_mode"):
        gigpo_step_advantages(r, 2, steps, gigpo_mode="std")
    with pytest.raises(ValueError, match="gigpo_gamma"):
        gigpo_step_advantages(r, 2, steps, gigpo_gamma=1.5)
    with pytest.raises(ValueError, match="split into groups"):
        gigpo_step_advantages(r, 3, steps)
    dup = StepBatch(torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="same \\(episode, index\\)"):
        gigpo_step_advantages(r, 2, dup)
