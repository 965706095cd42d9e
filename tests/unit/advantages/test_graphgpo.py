"""GraphGPO per-step advantages: hand-derived numbers on a merged graph, the official recipe's numbers, edge cases."""

import random

import pytest
import torch

from trl_groupx.advantages.graphgpo import graph_distances, graphgpo_step_advantages, next_state_keys
from trl_groupx.advantages.step_credit import StepBatch

from . import graphgpo_official as official
from .step_credit_fixtures import random_episodes, shuffled

NAN, INF = float("nan"), float("inf")


def grid():
    # G = 3.  ep0 (success): A → B → C → goal.  ep1 (failed): A → D → B → (final state unknown: own dead end).
    #         ep2 (failed): A → D → E → (dead end).
    # Merged graph distances to the goal: C 1, B 2, A 3, D 3 (D → B); E and the dead ends have no path: max 3 + 1 = 4.
    steps = StepBatch.from_lists([["A", "B", "C"], ["A", "D", "B"], ["A", "D", "E"]])
    return steps, torch.tensor([1.0, 0.0, 0.0])


def test_hand_values_mean_norm_distance_reducing_step_in_failed_episode_is_credited():
    steps, r = grid()
    # γ = .5, R = 10·.5^d(next):  ep0 [d(B)=2, d(C)=1, goal 0] → [2.5, 5, 10];  ep1 [d(D)=3, d(B)=2, dead 4] →
    # [1.25, 2.5, .625];  ep2 [d(D)=3, d(E)=4, dead 4] → [1.25, .625, .625].
    # state groups: A {2.5, 1.25, 1.25} mean 5/3 → [5/6, −5/12, −5/12];  B {ep0 t1: 5, ep1 t2: .625} mean 2.8125 →
    # ±2.1875;  D {ep1 t1: 2.5, ep2 t1: .625} mean 1.5625 → ±.9375;  C, E singletons → 0.
    # episode level (trajectory, mean_norm): [1, 0, 0] − 1/3 → [2/3, −1/3, −1/3].
    a = graphgpo_step_advantages(r, 3, steps, graphgpo_gamma=0.5, graphgpo_mode="mean_norm")
    expected = torch.tensor([5 / 6 + 2 / 3, 2.1875 + 2 / 3, 2 / 3,
                             -5 / 12 - 1 / 3, 0.9375 - 1 / 3, -2.1875 - 1 / 3,
                             -5 / 12 - 1 / 3, -0.9375 - 1 / 3, -1 / 3])
    torch.testing.assert_close(a, expected)
    assert a[4] > 0  # catalog check: ep1's D → B (distance 3 → 2) inside a failed episode gets positive advantage


def test_distances_on_the_merged_graph():
    steps, r = grid()
    nxt = next_state_keys(steps, 3, r > 0)
    d_src, d_dst = graph_distances(torch.zeros(9, dtype=torch.long), steps.state, nxt, torch.zeros(1, dtype=torch.long))
    assert d_src.tolist() == [3, 2, 1, 3, 3, 2, 3, 3, 4]  # A B C | A D B | A D E
    assert d_dst.tolist() == [2, 1, 0, 3, 2, 4, 3, 4, 4]


def test_final_state_supplied_by_the_rollout():
    steps, r = grid()
    # ep1 ran out of turns standing on C (distance 1): its last step B → C now returns 10·.5 = 5, like ep0's B → C,
    # so the B group {5, 5} is all-equal → 0 for both; every other number is unchanged.
    with_final = StepBatch.from_lists([["A", "B", "C"], ["A", "D", "B"], ["A", "D", "E"]],
                                      final_states=[None, "C", None])
    a = graphgpo_step_advantages(r, 3, with_final, graphgpo_gamma=0.5, graphgpo_mode="mean_norm")
    base = graphgpo_step_advantages(r, 3, steps, graphgpo_gamma=0.5, graphgpo_mode="mean_norm")
    torch.testing.assert_close(a[[1, 5]], torch.tensor([2 / 3, -1 / 3]))
    keep = [0, 2, 3, 4, 6, 7, 8]
    torch.testing.assert_close(a[keep], base[keep])


def test_normalize_distance_and_weights():
    steps, r = grid()
    # 10·.5^(d(next) − d(state) + 1): ep0 [.5^0, .5^0, .5^0]·10 = [10, 10, 10];  ep1 [A→D: .5^1, D→B: .5^0,
    # B→dead: .5^3] → [5, 10, 1.25];  ep2 [A→D: 5, D→E: .5^2 → 2.5, E→dead: .5^1 → 5].
    # groups: A {10, 5, 5} mean 20/3 → [10/3, −5/3, −5/3];  B {10, 1.25} → ±4.375;  D {10, 2.5} → ±3.75.
    # ω_E = 0 leaves the step level alone.
    a = graphgpo_step_advantages(r, 3, steps, graphgpo_gamma=0.5, graphgpo_mode="mean_norm",
                                 graphgpo_normalize_distance=True, graphgpo_episode_advantage_w=0.0)
    torch.testing.assert_close(a, torch.tensor([10 / 3, 4.375, 0, -5 / 3, 3.75, -4.375, -5 / 3, -3.75, 0]))
    # ω_S = 0: the episode level broadcast to every step (mean_std_norm: ±(2/3, 1/3)/std([1, 0, 0]) = /.57735)
    e = graphgpo_step_advantages(r, 3, steps, graphgpo_step_advantage_w=0.0)
    s = 3 ** -0.5
    torch.testing.assert_close(e, torch.tensor([2 / 3 / s] * 3 + [-1 / 3 / s] * 6), atol=1e-5, rtol=0)


def test_no_success_in_group_gives_episode_level_only():
    # no goal reached: every state is unreachable, d = 0 + 1 = 1 for all, R all equal → step advantage 0
    steps = StepBatch.from_lists([["A", "B"], ["A", "C"]])
    a = graphgpo_step_advantages(torch.tensor([0.0, 0.0]), 2, steps)
    assert torch.equal(a, torch.zeros(4))
    a = graphgpo_step_advantages(torch.tensor([0.0, -1.0]), 2, steps, graphgpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, -0.5, -0.5]))


def test_success_threshold():
    steps = StepBatch.from_lists([["A", "B"], ["A", "C"]])
    # threshold .5: only ep0 (reward 1) reaches the goal; ep1 (reward .3) does not.  γ = .5: ep0 [d(B)=1 → 5, 10],
    # ep1 [C: dead ends → d = max(2, 1, 0) + 1 = 3 → 1.25, dead end → 1.25]; A group {5, 1.25} → ±1.875
    a = graphgpo_step_advantages(torch.tensor([1.0, 0.3]), 2, steps, graphgpo_gamma=0.5, graphgpo_mode="mean_norm",
                                 graphgpo_success_threshold=0.5, graphgpo_episode_advantage_w=0.0)
    torch.testing.assert_close(a, torch.tensor([1.875, 0.0, -1.875, 0.0]))
    # default threshold 0: both reach the goal; A group {10·.5^1, 10·.5^1} equal → 0
    b = graphgpo_step_advantages(torch.tensor([1.0, 0.3]), 2, steps, graphgpo_gamma=0.5, graphgpo_mode="mean_norm",
                                 graphgpo_episode_advantage_w=0.0)
    assert torch.equal(b, torch.zeros(4))


@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
@pytest.mark.parametrize("normalize_distance", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_official_code(mode, normalize_distance, seed):
    states, _, outcomes = random_episodes(seed, binary=True)
    rng = random.Random(seed)
    finals = [f"s{rng.randrange(3)}" for _ in states]  # a failed episode's last observation, often on a path
    rows = official.rows_with_next_obs(states, outcomes, finals, 4)
    ref = official.graphgpo(rows, gamma=0.1, mode=mode, normalize_distance=normalize_distance)
    steps = StepBatch.from_lists(states, final_states=finals)
    ours = graphgpo_step_advantages(torch.tensor(outcomes), 4, shuffled_with_final(steps, seed), graphgpo_gamma=0.1,
                                    graphgpo_mode=mode, graphgpo_normalize_distance=normalize_distance,
                                    graphgpo_episode_stats="steps")
    got = official.official.ours_in_row_order(ours, shuffled_with_final(steps, seed), rows)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    assert (ref != 0).any()


def shuffled_with_final(steps, seed):
    out = shuffled(steps, seed)
    out.final_state = steps.final_state
    return out


def test_groups_are_per_prompt():
    # the same states in two prompt groups: group 1 (no success) must not use group 0's path to the goal
    steps = StepBatch.from_lists([["A", "B"], ["A", "C"], ["A", "B"], ["A", "C"]])
    a = graphgpo_step_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, steps, graphgpo_gamma=0.5,
                                 graphgpo_mode="mean_norm", graphgpo_episode_advantage_w=0.0)
    # group 0: d(B) = 1, C → dead end, d(C) = d(dead) = max(2, 1, 0) + 1 = 3: A {5, 1.25} → ±1.875; group 1: all 0
    torch.testing.assert_close(a, torch.tensor([1.875, 0.0, -1.875, 0.0, 0, 0, 0, 0]))


def test_all_equal_group_size_one_and_two():
    steps = StepBatch.from_lists([["a", "b"], ["a", "b"]])
    assert torch.equal(graphgpo_step_advantages(torch.tensor([1.0, 1.0]), 2, steps), torch.zeros(4))
    # G = 1: every state group and every episode group is a singleton → 0
    one = StepBatch.from_lists([["a", "b"], ["a"]])
    assert torch.equal(graphgpo_step_advantages(torch.tensor([1.0, 0.0]), 1, one), torch.zeros(3))
    # G = 2, mean_std_norm, γ = .1: A group {10·.1^d(B)=1, 10·.1^d(C)=.01} (d(C) = max(2, 1, 0) + 1 = 3): two values
    # x ± m give ±m / (m·√2) = ±.70711
    two = StepBatch.from_lists([["A", "B"], ["A", "C"]])
    a = graphgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, two, graphgpo_episode_advantage_w=0.0)
    torch.testing.assert_close(a, torch.tensor([2 ** -0.5, 0.0, -(2 ** -0.5), 0.0]), atol=1e-5, rtol=0)


def test_nan_episode_left_out_of_graph_and_statistics():
    # ep1 unscored: its edge C → B would give C a path (d = 2); left out, ep2's C leads to a dead end instead.
    # γ = .5: ep0 [A→B d 1: 5, B→goal: 10];  ep2 [A→C: d(C) = max(2, 1, 0) + 1 = 3 → 1.25, C→dead: 1.25].
    # A group {5, 1.25} → ±1.875 (ep1 excluded); episode level over {1, 0}: ±.5
    steps = StepBatch.from_lists([["A", "B"], ["C", "B"], ["A", "C"]])
    a = graphgpo_step_advantages(torch.tensor([1.0, NAN, 0.0]), 3, steps, graphgpo_gamma=0.5,
                                 graphgpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([2.375, 0.5, 0.0, 0.0, -2.375, -0.5]))
    all_nan = graphgpo_step_advantages(torch.tensor([NAN, NAN, NAN]), 3, steps)
    assert torch.equal(all_nan, torch.zeros(6))


def test_step_order_and_padding_never_read():
    # steps listed out of order and with gaps in `index` give the same numbers as the ordered batch; step rewards
    # (even NaN) are never read
    steps, r = grid()
    perm = torch.tensor([8, 0, 4, 2, 6, 1, 3, 7, 5])
    jumbled = StepBatch(steps.episode[perm], steps.index[perm] * 5, steps.state[perm], torch.full((9,), NAN))
    a = graphgpo_step_advantages(r, 3, jumbled, graphgpo_gamma=0.5)
    b = graphgpo_step_advantages(r, 3, steps, graphgpo_gamma=0.5)
    torch.testing.assert_close(a, b[perm])


def test_empty_steps_and_episode_without_steps():
    assert graphgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, StepBatch.from_lists([[], []])).shape == (0,)
    # a truncated episode that recorded no step: only the episode level (trajectory, mean_norm: ±.5) of ep0 remains
    steps = StepBatch.from_lists([["a"], []])
    a = graphgpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, graphgpo_mode="mean_norm")
    torch.testing.assert_close(a, torch.tensor([0.5]))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_rewards_name_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='graphgpo'.*infinite"):
        graphgpo_step_advantages(torch.tensor([bad, 0.0]), 2, StepBatch.from_lists([["a"], ["b"]]))


def test_bad_settings_and_shapes():
    steps, r = grid()
    with pytest.raises(ValueError, match="graphgpo_mode"):
        graphgpo_step_advantages(r, 3, steps, graphgpo_mode="std")
    with pytest.raises(ValueError, match="graphgpo_gamma"):
        graphgpo_step_advantages(r, 3, steps, graphgpo_gamma=0.0)
    with pytest.raises(ValueError, match="graphgpo_episode_stats"):
        graphgpo_step_advantages(r, 3, steps, graphgpo_episode_stats="rows")
    bad_final = StepBatch(steps.episode, steps.index, steps.state, steps.reward, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="final_state"):
        graphgpo_step_advantages(r, 3, bad_final)
