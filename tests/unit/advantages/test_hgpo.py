"""HGPO per-step advantages: hand-derived numbers, the official verl-agent recipe's numbers, and the edge cases."""

import pytest
import torch

from trl_groupx.advantages.gigpo import gigpo_step_advantages
from trl_groupx.advantages.hgpo import hgpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch

from . import step_credit_official as official
from .step_credit_fixtures import random_episodes, shuffled

NAN, INF = float("nan"), float("inf")
EPS = 1e-6


def three_episodes():
    # G = 3, γ = 1.  ep0: A → B, rewards [0, 1] → returns [1, 1];  ep1: A → B, [0, 0] → [0, 0];
    #                ep2: C → B, [0, 1] → [1, 1]
    steps = StepBatch.from_lists([["A", "B"], ["A", "B"], ["C", "B"]], [[0, 1], [0, 0], [0, 1]])
    return steps, torch.tensor([1.0, 0.0, 1.0])


def test_hand_values_mean_norm():
    steps, r = three_episodes()
    # level 1 (current state): A = {ep0 t0: 1, ep1 t0: 0} → ±.5;  C singleton (skipped);
    #                          B = {ep0 t1: 1, ep1 t1: 0, ep2 t1: 1}, mean 2/3 → +1/3, −2/3, +1/3
    # level 2 (previous, current): (A, B) = {ep0 t1: 1, ep1 t1: 0} → ±.5;  (C, B) singleton (skipped)
    # weights L = k + 1: level 1 → 2, level 2 → 3, normalised over the levels present (+1e-6):
    #   ep0 t0: .5·2/(2+ε);  ep0 t1: (2·1/3 + 3·.5)/(5+ε) = 13/30;  ep1 t0: −.5;  ep1 t1: (2·−2/3 + 3·−.5)/5 = −17/30
    #   ep2 t0: no group → 0;  ep2 t1: only level 1 → 1/3 (its history C → B is not shared)
    a = hgpo_step_advantages(r, 3, steps, hgpo_gamma=1.0, hgpo_history_length=1, hgpo_mode="mean_norm")
    expected = torch.tensor([0.5 * 2 / (2 + EPS), 13 / 6 / (5 + EPS), -0.5 * 2 / (2 + EPS), -17 / 6 / (5 + EPS),
                             0.0, 1 / 3 * 2 / (2 + EPS)])
    torch.testing.assert_close(a, expected)


def test_population_std():
    steps, r = three_episodes()
    # mean_std_norm, history 0 (level 1 only): A = {1, 0}: population std .5 → ±.5/.5 = ±1 (unbiased would be ±.707)
    # B = {1, 0, 1}: mean 2/3, population std sqrt(2/9) = .4714 → +.7071, −1.4142, +.7071
    a = hgpo_step_advantages(r, 3, steps, hgpo_gamma=1.0, hgpo_history_length=0)
    sd = (2 / 9) ** 0.5
    expected = torch.tensor([0.5 / (0.5 + EPS), (1 / 3) / (sd + EPS), -0.5 / (0.5 + EPS), (-2 / 3) / (sd + EPS),
                             0.0, (1 / 3) / (sd + EPS)]) * (2 / (2 + EPS))
    torch.testing.assert_close(a, expected)


def test_zero_level_advantage_is_dropped_before_weighting():
    # γ = 1.  ep0: A → B returns [1, 1];  ep1: A → B, [.5, .5];  ep2: C → B, [0, 0]
    # level 1, B = {1, .5, 0}: mean .5 → ep1 t1 gets exactly 0 there → dropped; level 2, (A, B) = {1, .5}: mean .75
    # → ep1 t1 = −.25 with the whole weight 3/(3+ε)  (keeping the zero would give (2·0 + 3·−.25)/5 = −.15)
    steps = StepBatch.from_lists([["A", "B"], ["A", "B"], ["C", "B"]], [[0, 1], [0, 0.5], [0, 0]])
    a = hgpo_step_advantages(torch.tensor([1.0, 0.5, 0.0]), 3, steps, hgpo_gamma=1.0, hgpo_history_length=1,
                             hgpo_mode="mean_norm")
    torch.testing.assert_close(a[3], torch.tensor(-0.25 * 3 / (3 + EPS)))


def test_catalog_check_levels_and_weights():
    # catalog check: steps with identical last-k histories share the level-k group; the weights sum to 1 (− ε):
    # with identical histories at every level, A equals the (common) level advantage
    steps = StepBatch.from_lists([["s0", "s1", "s2"], ["s0", "s1", "s2"]], [[0, 0, 1], [0, 0, 0]])
    a = hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, hgpo_gamma=1.0, hgpo_mode="mean_norm")
    # every level of every step: {1, 0} → ±.5;  weights (2 + 3 + 4)/(9 + ε) at t2, (2+3)/(5+ε) at t1, 2/(2+ε) at t0
    w = torch.tensor([2 / (2 + EPS), 5 / (5 + EPS), 9 / (9 + EPS)])
    torch.testing.assert_close(a, torch.cat([0.5 * w, -0.5 * w]))


@pytest.mark.parametrize("base_group", [False, True])
@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_official_code(base_group, mode, seed):
    states, rewards, outcomes = random_episodes(seed, alphabet=2)
    steps = StepBatch.from_lists(states, rewards)
    rows = official.rows_from_episodes(states, rewards, outcomes, 4)
    ref = official.hgpo(rows, gamma=0.95, history_length=2, mode=mode, alpha=1.0, base_group=base_group)
    sh = shuffled(steps, seed)
    ours = hgpo_step_advantages(torch.tensor(outcomes), 4, sh, hgpo_mode=mode, hgpo_base_group=base_group)
    torch.testing.assert_close(official.ours_in_row_order(ours, sh, rows), ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("history_length,alpha", [(0, 1.0), (4, 2.0), (1, 0.0)])
def test_matches_official_code_other_settings(history_length, alpha):
    states, rewards, outcomes = random_episodes(7, alphabet=2, max_len=7)
    steps = StepBatch.from_lists(states, rewards)
    rows = official.rows_from_episodes(states, rewards, outcomes, 4)
    ref = official.hgpo(rows, history_length=history_length, alpha=alpha)
    ours = hgpo_step_advantages(torch.tensor(outcomes), 4, steps, hgpo_history_length=history_length,
                                hgpo_length_weight_alpha=alpha)
    torch.testing.assert_close(official.ours_in_row_order(ours, steps, rows), ref, atol=2e-5, rtol=1e-5)


def test_level_one_only_is_gigpo_step_part_with_population_std():
    # history 0 and α irrelevant: A = a_1 ·2/(2+ε) — GiGPO's anchor-state advantage but with the population std
    steps = StepBatch.from_lists([["s"], ["s"], ["s"]], [[1], [0], [0]])
    h = hgpo_step_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, steps, hgpo_history_length=0, hgpo_mode="mean_norm")
    g = gigpo_step_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, steps, gigpo_step_advantage_w=1.0,
                              gigpo_mode="mean_norm", gigpo_gamma=0.95)
    ep = torch.tensor([2 / 3, -1 / 3, -1 / 3])
    torch.testing.assert_close(h, (g - ep) * 2 / (2 + EPS))


def test_all_equal_group_size_one_and_two():
    steps = StepBatch.from_lists([["a", "b"], ["a", "b"]], [[0, 1], [0, 1]])
    assert torch.equal(hgpo_step_advantages(torch.tensor([1.0, 1.0]), 2, steps), torch.zeros(4))
    steps1 = StepBatch.from_lists([["a"], ["a"]], [[1], [0]])
    assert torch.equal(hgpo_step_advantages(torch.tensor([1.0, 0.0]), 1, steps1), torch.zeros(2))
    a2 = hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps1, hgpo_mode="mean_norm")
    torch.testing.assert_close(a2, torch.tensor([0.5, -0.5]) * 2 / (2 + EPS))


def test_nan_episode_and_nan_step_reward():
    steps = StepBatch.from_lists([["s"], ["s"], ["s"]], [[1], [5], [0]])
    a = hgpo_step_advantages(torch.tensor([1.0, NAN, 0.0]), 3, steps, hgpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.0, -0.5]) * 2 / (2 + EPS))
    steps = StepBatch.from_lists([["s"], ["s"], ["s"]], [[1], [NAN], [0]])
    a = hgpo_step_advantages(torch.tensor([1.0, 1.0, 0.0]), 3, steps, hgpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.0, -0.5]) * 2 / (2 + EPS))


def test_base_group_adds_episode_level():
    # G = 2, single steps in different states (no step groups): only the base level (weight 1) remains
    steps = StepBatch.from_lists([["a"], ["b"]], [[1], [0]])
    a = hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, hgpo_mode="mean_norm", hgpo_base_group=True)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5]) / (1 + EPS))


def test_empty_and_errors():
    assert hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, StepBatch.from_lists([[], []])).shape == (0,)
    steps = StepBatch.from_lists([["a"], ["b"]], [[0], [INF]])
    with pytest.raises(ValueError, match="advantage_estimator='hgpo'.*infinite"):
        hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps)
    ok = StepBatch.from_lists([["a"], ["b"]])
    with pytest.raises(ValueError, match="hgpo_history_length"):
        hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, ok, hgpo_history_length=-1)
    with pytest.raises(ValueError, match="hgpo_mode"):
        hgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, ok, hgpo_mode="x")
