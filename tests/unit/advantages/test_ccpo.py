"""CCPO (`advantage_estimator="ccpo"`): per-agent rewards from the team outcome and a counterfactual run, one group
baseline per agent, laid out on each agent's turns."""

import math

import pytest
import torch

from tests.unit.advantages.ccpo_official import official_role_advantages
from trl_groupx.advantages.ccpo import ccpo_step_advantages, counterfactual_role_rewards
from trl_groupx.advantages.step_credit import StepBatch, state_key
from trl_groupx.config import GRPOConfig

T, S = "thinker", "solver"
NAN = float("nan")


def steps_for(modules):
    """A StepBatch whose episode e has the turns `modules[e]` (agent names), in order."""
    return StepBatch.from_lists([[f"e{e}t{t}" for t in range(len(m))] for e, m in enumerate(modules)],
                                modules=modules)


def per_agent(out, steps, agent):
    """`{episode: advantage}` of the turns of `agent` (one turn per agent per episode here)."""
    mine = steps.module == state_key(agent)
    return dict(zip(steps.episode[mine].tolist(), out[mine].tolist()))


def ccpo(team, solo, g, modules, **kw):
    steps = steps_for(modules)
    out = ccpo_step_advantages(torch.tensor(team), g, steps, counterfactual_rewards=torch.tensor(solo), **kw)
    return per_agent(out, steps, T), per_agent(out, steps, S), out


def test_hand_derived_official_defaults():
    # λ = 0.2, event bonus, group solo baseline, ±1 verifier outcome, no std.
    # group 0: R = [1,0,1,0] → o = [1,−1,1,−1]; R̃ = [0,0,1,0] → õ = [−1,−1,1,−1], b = −0.5;
    #   helped = o>0 ∧ b<0 = [1,0,1,0], hurt = 0 → r¹ = [1.2,−1,1.2,−1], mean 0.1 → A¹ = [1.1,−1.1,1.1,−1.1];
    #   r² = o, mean 0 → A² = [1,−1,1,−1].
    # group 1: R = [1,1,0,0] → o = [1,1,−1,−1]; R̃ = [1,1,1,0] → b = 0.5; hurt = o<0 ∧ b>0 = [0,0,1,1]
    #   → r¹ = [1,1,−1.2,−1.2], mean −0.1 → A¹ = [1.1,1.1,−1.1,−1.1]; A² = [1,1,−1,−1].
    # Episode 2 has no Solver turn (the Thinker ended it): its team reward still counts in the Solver's baseline.
    modules = [[T, S]] * 2 + [[T]] + [[T, S]] * 5
    a1, a2, out = ccpo([1, 0, 1, 0, 1, 1, 0, 0], [0, 0, 1, 0, 1, 1, 1, 0], 4, modules)
    assert out.shape == (15,) and out.dtype == torch.float32
    assert a1 == pytest.approx({0: 1.1, 1: -1.1, 2: 1.1, 3: -1.1, 4: 1.1, 5: 1.1, 6: -1.1, 7: -1.1})
    assert a2 == pytest.approx({0: 1, 1: -1, 3: -1, 4: 1, 5: 1, 6: -1, 7: -1})


def test_matches_official_transcription():
    torch.manual_seed(0)
    g, n = 8, 32
    for use_group in (True, False):
        for use_event in (True, False):
            for lam in (0.2, 0.7):
                joint = torch.randint(0, 2, (n,)).float().tolist()  # 0/1 verifier scores, as the official data
                solo = (torch.rand(n) * 2 - 0.5).tolist()  # any real scores: only their sign enters
                ref1, ref2 = official_role_advantages(joint, solo, g, lam=lam, use_group_solo_baseline=use_group,
                                                      use_event_bonus=use_event)
                a1, a2, _ = ccpo(joint, solo, g, [[T, S]] * n, ccpo_lambda=lam,
                                 ccpo_solo_baseline="group" if use_group else "row",
                                 ccpo_credit="event" if use_event else "delta")
                torch.testing.assert_close(torch.tensor([a1[e] for e in range(n)]), ref1)
                torch.testing.assert_close(torch.tensor([a2[e] for e in range(n)]), ref2)


def test_abstract_marginal_credit_is_team_minus_counterfactual():
    # ccpo_credit="marginal", row baseline, raw rewards: r¹ = R − R̃ = [1,0,0,0] (mean 0.25)
    # → A¹ = [.75,−.25,−.25,−.25]; r² = R = [1,0,1,0] → A² = [.5,−.5,.5,−.5].
    team, solo = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0, 0.0])
    r1, r2 = counterfactual_role_rewards(team, solo, 4, ccpo_credit="marginal", ccpo_solo_baseline="row",
                                         ccpo_outcome="raw")
    assert torch.equal(r1, (team - solo).double()) and torch.equal(r2, team.double())
    a1, a2, _ = ccpo(team.tolist(), solo.tolist(), 4, [[T, S]] * 4, ccpo_credit="marginal",
                     ccpo_solo_baseline="row", ccpo_outcome="raw")
    assert a1 == pytest.approx({0: 0.75, 1: -0.25, 2: -0.25, 3: -0.25})
    assert a2 == pytest.approx({0: 0.5, 1: -0.5, 2: 0.5, 3: -0.5})


def test_delta_bonus_on_raw_rewards():
    # "delta", row baseline, raw: bonus = (R − R̃)/2 = [.5,0,0,0]; r¹ = R + 0.2·bonus = [1.1,0,1,0], mean 0.525
    # → A¹ = [0.575,−0.525,0.475,−0.525].
    a1, _, _ = ccpo([1, 0, 1, 0], [0, 0, 1, 0], 4, [[T, S]] * 4, ccpo_credit="delta", ccpo_solo_baseline="row",
                    ccpo_outcome="raw")
    assert a1 == pytest.approx({0: 0.575, 1: -0.525, 2: 0.475, 3: -0.525})


def test_std_scaling():
    # group 0 of the hand example with ccpo_scale: r¹ deviations ±1.1, unbiased std = 1.1·sqrt(4/3).
    a1, a2, _ = ccpo([1, 0, 1, 0], [0, 0, 1, 0], 4, [[T, S]] * 4, ccpo_scale=True)
    expected = 1.1 / (1.1 * math.sqrt(4 / 3) + 1e-6)
    assert a1 == pytest.approx({0: expected, 1: -expected, 2: expected, 3: -expected})
    assert a2[0] == pytest.approx(1 / (math.sqrt(4 / 3) + 1e-6))


def test_lambda_zero_gives_the_team_advantage_to_every_turn():
    a1, a2, _ = ccpo([1, 0, 1, 0, 1, 1, 0, 0], [0, 0, 1, 0, 1, 1, 1, 0], 4, [[T, S]] * 8, ccpo_lambda=0.0)
    assert a1 == a2


def test_all_equal_groups_give_zero():
    # every episode helped alike: r¹ = 1.2 everywhere, r² = 1 everywhere → exactly 0; a mixed counterfactual changes
    # nothing when the team outcome is constant and the baseline has one sign.
    _, _, out = ccpo([1, 1, 1, 1, 0.3, 0.3, 0.3, 0.3], [0, 0, 0, 0, 0, 1, 0, 0], 4, [[T, S]] * 8)
    assert torch.equal(out, torch.zeros(16))


def test_nan_rewards():
    # team NaN at episode 1: excluded, its turns get 0. Counterfactual NaN at episode 2: left out of
    # b = mean(−1,−1,−1).
    # o = [1,·,1,−1], b = −1 → helped = [1,·,1,0] → r¹ = [1.2,·,1.2,−1], mean 1.4/3 → A¹ = [.7333,0,.7333,−1.4667];
    # r² = [1,·,1,−1], mean 1/3 → A² = [2/3,0,2/3,−4/3].
    a1, a2, _ = ccpo([1, NAN, 1, 0], [0, 0, NAN, 0], 4, [[T, S]] * 4)
    assert a1 == pytest.approx({0: 1.2 - 1.4 / 3, 1: 0.0, 2: 1.2 - 1.4 / 3, 3: -1 - 1.4 / 3})
    assert a2 == pytest.approx({0: 2 / 3, 1: 0.0, 2: 2 / 3, 3: -4 / 3})


def test_unscored_counterfactual_group_gives_no_bonus():
    a1, a2, _ = ccpo([1, 0, 1, 0], [NAN] * 4, 4, [[T, S]] * 4)
    assert a1 == a2 == pytest.approx({0: 1, 1: -1, 2: 1, 3: -1})
    # "marginal": the credited reward is unscored too → the Thinker's turns get 0, the Solver's keep the team credit
    a1, a2, _ = ccpo([1, 0, 1, 0], [NAN] * 4, 4, [[T, S]] * 4, ccpo_credit="marginal")
    assert a1 == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0} and a2 == pytest.approx({0: 1, 1: -1, 2: 1, 3: -1})


def test_group_size_two():
    # R = [1,0] → o = [1,−1]; R̃ = [0,1] → õ = [−1,1]. Group baseline b = 0: no event, A¹ = A² = [1,−1].
    # Row baseline b = [−1,1]: helped ep 0, hurt ep 1 → r¹ = [1.2,−1.2] → A¹ = [1.2,−1.2].
    a1, a2, _ = ccpo([1, 0], [0, 1], 2, [[T, S]] * 2)
    assert a1 == a2 == pytest.approx({0: 1, 1: -1})
    a1, _, _ = ccpo([1, 0], [0, 1], 2, [[T, S]] * 2, ccpo_solo_baseline="row")
    assert a1 == pytest.approx({0: 1.2, 1: -1.2})


def test_turn_order_and_repeated_turns_follow_the_labels():
    # a Solver turn first and two Thinker turns: each turn gets its own agent's advantage
    modules = [[S, T, T], [T, S], [T, S], [T, S]]
    steps = steps_for(modules)
    out = ccpo_step_advantages(torch.tensor([1.0, 0, 1, 0]), 4, steps,
                               counterfactual_rewards=torch.tensor([0.0, 0, 1, 0]))
    # group 0 of the hand example: A¹ = [1.1,−1.1,1.1,−1.1], A² = [1,−1,1,−1]
    assert out[:3].tolist() == pytest.approx([1.0, 1.1, 1.1])


def test_trainer_keys_are_recognised():
    # the trainer hashes the names before gathering them and StepBatch.from_lists hashes those keys again
    steps = StepBatch.from_lists([["a", "b"]] * 2, modules=[[state_key(T), state_key(S)]] * 2)
    out = ccpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, counterfactual_rewards=torch.tensor([0.0, 1.0]),
                               ccpo_solo_baseline="row")
    assert out.tolist() == pytest.approx([1.2, 1.0, -1.2, -1.0])


def test_bad_inputs_raise():
    steps = steps_for([[T, S]] * 4)
    cf = torch.zeros(4)
    with pytest.raises(ValueError, match="infinite"):
        ccpo_step_advantages(torch.tensor([1.0, float("inf"), 0, 0]), 4, steps, counterfactual_rewards=cf)
    with pytest.raises(ValueError, match="infinite counterfactual"):
        ccpo_step_advantages(torch.zeros(4), 4, steps, counterfactual_rewards=torch.tensor([0, float("-inf"), 0, 0]))
    with pytest.raises(ValueError, match=r"counterfactual_rewards must be \(4,\)"):
        ccpo_step_advantages(torch.zeros(4), 4, steps, counterfactual_rewards=torch.zeros(3))
    with pytest.raises(ValueError, match="step_modules"):
        ccpo_step_advantages(torch.zeros(4), 4, StepBatch.from_lists([["a"]] * 4), counterfactual_rewards=cf)
    with pytest.raises(ValueError, match="ccpo_credited_agent='planner'"):
        ccpo_step_advantages(torch.zeros(4), 4, steps, counterfactual_rewards=cf, ccpo_credited_agent="planner")


@pytest.mark.parametrize(
    "flags, match",
    [({"ccpo_credit": "shapley"}, "ccpo_credit must be one of"),
     ({"ccpo_solo_baseline": "global"}, "ccpo_solo_baseline must be one of"),
     ({"ccpo_outcome": "binary"}, "ccpo_outcome must be one of"),
     ({"ccpo_lambda": -0.1}, "ccpo_lambda must be >= 0"),
     ({"ccpo_lambda": float("nan")}, "ccpo_lambda must be >= 0"),
     ({"ccpo_credited_agent": ""}, "ccpo_credited_agent must name the agent")],
)
def test_config_errors_name_the_flag(flags, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="ccpo", **flags)


def test_params_need_the_variant():
    with pytest.raises(ValueError, match="ccpo_lambda"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, ccpo_lambda=0.5)
