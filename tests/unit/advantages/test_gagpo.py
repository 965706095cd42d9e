"""GAGPO per-step advantages: the catalog checks (λ = 1 → return − V, λ = 0 → TD(0) residual), hand-derived GAE
numbers, the normalisation and the edge cases."""

import pytest
import torch

from trl_groupx.advantages.gagpo import gagpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, discounted_returns

from .step_credit_fixtures import random_episodes, shuffled

NAN, INF = float("nan"), float("inf")


def branch():
    # G = 2, three steps each; the episodes share A and B and part at the last action: ep0 B → C and wins (R = 1),
    # ep1 B → D and loses (R = 0).  Outcome rewards: r = [0, 0, R].
    return StepBatch.from_lists([["A", "B", "C"], ["A", "B", "D"]]), torch.tensor([1.0, 0.0])


def test_catalog_lambda_one_gamma_one_is_return_minus_value():
    steps, r = branch()
    # γ = 1: G = ep0 [1, 1, 1], ep1 [0, 0, 0];  V(A) = V(B) = .5, V(C) = 1, V(D) = 0.
    # λ = 1: Â = G − V = ep0 [.5, .5, 0], ep1 [−.5, −.5, 0]
    a = gagpo_step_advantages(r, 2, steps, gagpo_gamma=1.0, gagpo_lambda=1.0, gagpo_norm="none")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, 0.0, -0.5, -0.5, 0.0]))


def test_catalog_lambda_zero_is_the_td0_residual():
    steps, r = branch()
    # δ_t = r_t + V(s_{t+1}) − V(s_t), V after the last step 0:
    # ep0: 0 + V(B) − V(A) = 0;  0 + V(C) − V(B) = .5;  1 + 0 − V(C) = 0
    # ep1: 0 + .5 − .5 = 0;      0 + V(D) − V(B) = −.5;  0 + 0 − V(D) = 0   → credit only at the parting step
    a = gagpo_step_advantages(r, 2, steps, gagpo_gamma=1.0, gagpo_lambda=0.0, gagpo_norm="none")
    torch.testing.assert_close(a, torch.tensor([0.0, 0.5, 0.0, 0.0, -0.5, 0.0]))


def test_hand_values_gamma_lambda_half_and_normalisation():
    steps, r = branch()
    # γ = .5: G = ep0 [.25, .5, 1], ep1 0;  V(A) = .125, V(B) = .25, V(C) = 1, V(D) = 0.
    # δ ep0: [0 + .5·.25 − .125, 0 + .5·1 − .25, 1 − 1] = [0, .25, 0];  δ ep1: [0, 0 + 0 − .25, 0] = [0, −.25, 0]
    # GAE with γλ = .25: ep0 [0 + .25·.25, .25, 0] = [.0625, .25, 0];  ep1 [−.0625, −.25, 0]
    raw = torch.tensor([0.0625, 0.25, 0.0, -0.0625, -0.25, 0.0])
    a = gagpo_step_advantages(r, 2, steps, gagpo_gamma=0.5, gagpo_lambda=0.5, gagpo_norm="none")
    torch.testing.assert_close(a, raw)
    # mean_std over the group's six steps: mean 0, unbiased std √((2·.0625² + 2·.25²)/5) = .1629801
    std = ((2 * 0.0625**2 + 2 * 0.25**2) / 5) ** 0.5
    n = gagpo_step_advantages(r, 2, steps, gagpo_gamma=0.5, gagpo_lambda=0.5)
    torch.testing.assert_close(n, raw / (std + 1e-6))
    m = gagpo_step_advantages(r, 2, steps, gagpo_gamma=0.5, gagpo_lambda=0.5, gagpo_norm="mean")
    torch.testing.assert_close(m, raw)  # already centred


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("source", ["outcome", "steps"])
def test_lambda_one_equals_return_minus_grouped_value_for_any_gamma(seed, source):
    states, rewards, outcomes = random_episodes(seed)
    steps = StepBatch.from_lists(states, rewards)
    r = torch.tensor(outcomes)
    # reference: returns of the chosen rewards, V = mean return of the same (group, state), Â = G − V
    if source == "outcome":
        last = [[0.0] * (len(s) - 1) + [outcomes[e]] for e, s in enumerate(states)]
        g = discounted_returns(StepBatch.from_lists(states, last), len(states), 0.9)
    else:
        g = discounted_returns(steps, len(states), 0.9)
    keys = list(zip((steps.episode // 4).tolist(), steps.state.tolist()))
    v = torch.tensor([sum(g[j] for j, k2 in enumerate(keys) if k2 == k) / keys.count(k) for k in keys])
    ours = gagpo_step_advantages(r, 4, shuffled(steps, seed), gagpo_gamma=0.9, gagpo_lambda=1.0, gagpo_norm="none",
                                 gagpo_reward_source=source)
    perm = torch.randperm(steps.num_steps, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(ours, (g - v)[perm], atol=1e-5, rtol=1e-5)


def test_step_rewards_source():
    # step rewards instead of the outcome: ep0 rewards [1, 0], ep1 [0, 0] on A → B; γ = 1, λ = 0.
    # G ep0 [1, 0], ep1 [0, 0]; V(A) = .5, V(B) = 0.  δ ep0 [1 + 0 − .5, 0] = [.5, 0]; ep1 [0 + 0 − .5, 0] = [−.5, 0]
    steps = StepBatch.from_lists([["A", "B"], ["A", "B"]], [[1, 0], [0, 0]])
    a = gagpo_step_advantages(torch.tensor([5.0, 5.0]), 2, steps, gagpo_gamma=1.0, gagpo_lambda=0.0,
                              gagpo_norm="none", gagpo_reward_source="steps")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.0, -0.5, 0.0]))
    # the same batch with the outcome source: equal outcomes → nothing to learn
    b = gagpo_step_advantages(torch.tensor([5.0, 5.0]), 2, steps, gagpo_gamma=1.0, gagpo_lambda=0.0,
                              gagpo_norm="none")
    assert torch.equal(b, torch.zeros(4))


def test_groups_are_per_prompt():
    # the same states in two prompt groups never share a value: group 1 (equal outcomes) gets 0
    steps = StepBatch.from_lists([["A"], ["A"], ["A"], ["A"]])
    a = gagpo_step_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, steps, gagpo_norm="none")
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_all_equal_group_size_one_and_two():
    steps, _ = branch()
    assert torch.equal(gagpo_step_advantages(torch.tensor([1.0, 1.0]), 2, steps), torch.zeros(6))
    # G = 1: every state is seen once, V = G_t, δ_t = r_t + γ G_{t+1} − G_t = 0
    one = StepBatch.from_lists([["a", "b"], ["c"]])
    assert torch.equal(gagpo_step_advantages(torch.tensor([1.0, 0.0]), 1, one, gagpo_norm="none"), torch.zeros(3))
    # G = 2 with one step each from the same state: Â = R − mean → ±.5, normalised by std(.5, −.5) = .70711
    two = StepBatch.from_lists([["s"], ["s"]])
    a = gagpo_step_advantages(torch.tensor([1.0, 0.0]), 2, two)
    torch.testing.assert_close(a, torch.tensor([2 ** -0.5, -(2 ** -0.5)]), atol=1e-5, rtol=0)


def test_nan_episode_excluded_from_value_and_normalisation():
    # ep1 unscored: V(A) over {ep0: 1, ep2: 0} only = .5 (with ep1's NaN counted it would be undefined); λ = γ = 1
    steps = StepBatch.from_lists([["A"], ["A"], ["A"]])
    a = gagpo_step_advantages(torch.tensor([1.0, NAN, 0.0]), 3, steps, gagpo_gamma=1.0, gagpo_lambda=1.0,
                              gagpo_norm="none")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.0, -0.5]))
    assert torch.equal(gagpo_step_advantages(torch.tensor([NAN, NAN, NAN]), 3, steps), torch.zeros(3))


def test_nan_step_reward_zeroes_that_step_and_earlier_ones():
    # "steps" source, ep0 step 1 reward NaN: ep0's G, δ and Â at t0 and t1 are NaN → 0; ep1 uses V from ep1 alone:
    # G ep1 [1, 1], V(A) = 1, V(B) = 1 → Â = 0 (γ = λ = 1)
    steps = StepBatch.from_lists([["A", "B"], ["A", "B"]], [[0, NAN], [0, 1]])
    a = gagpo_step_advantages(torch.tensor([1.0, 1.0]), 2, steps, gagpo_gamma=1.0, gagpo_lambda=1.0,
                              gagpo_norm="none", gagpo_reward_source="steps")
    assert torch.equal(a, torch.zeros(4))
    assert not torch.isnan(a).any()


def test_step_order_and_index_gaps_do_not_matter():
    steps, r = branch()
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    jumbled = StepBatch(steps.episode[perm], steps.index[perm] * 7, steps.state[perm], steps.reward[perm])
    a = gagpo_step_advantages(r, 2, jumbled, gagpo_gamma=0.5, gagpo_lambda=0.5)
    b = gagpo_step_advantages(r, 2, steps, gagpo_gamma=0.5, gagpo_lambda=0.5)
    torch.testing.assert_close(a, b[perm])


def test_empty_steps_and_episode_without_steps():
    assert gagpo_step_advantages(torch.tensor([1.0, 0.0]), 2, StepBatch.from_lists([[], []])).shape == (0,)
    # an episode without steps takes no part: ep0 alone at state a → V = its own return → 0
    steps = StepBatch.from_lists([["a"], []])
    assert torch.equal(gagpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, gagpo_norm="none"), torch.zeros(1))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_rewards_name_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='gagpo'.*infinite"):
        gagpo_step_advantages(torch.tensor([bad, 0.0]), 2, StepBatch.from_lists([["a"], ["b"]]))
    with pytest.raises(ValueError, match="advantage_estimator='gagpo'.*infinite"):
        gagpo_step_advantages(torch.tensor([1.0, 0.0]), 2, StepBatch.from_lists([["a"], ["b"]], [[0], [bad]]))


def test_bad_settings():
    steps, r = branch()
    with pytest.raises(ValueError, match="gagpo_lambda"):
        gagpo_step_advantages(r, 2, steps, gagpo_lambda=1.5)
    with pytest.raises(ValueError, match="gagpo_gamma"):
        gagpo_step_advantages(r, 2, steps, gagpo_gamma=-0.1)
    with pytest.raises(ValueError, match="gagpo_norm"):
        gagpo_step_advantages(r, 2, steps, gagpo_norm="std")
    with pytest.raises(ValueError, match="gagpo_reward_source"):
        gagpo_step_advantages(r, 2, steps, gagpo_reward_source="env")
    with pytest.raises(ValueError, match="split into groups"):
        gagpo_step_advantages(r, 3, steps)
