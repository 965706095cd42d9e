"""ctde_marl: joint team reward = quality − λ_time · time − λ_coord · messages."""

from types import SimpleNamespace

import pytest

from trl_groupx.rewards import JointTeamReward, bind_training_args, joint_team_reward


def test_hand_values():
    r = JointTeamReward(lambda_time=0.1, lambda_coord=0.05, max_completion_len=100)
    comps = ["<msg>plan</msg><msg>ok</msg><answer>7</answer>", "<answer>7</answer>", "<answer>8</answer>"]
    ids = [[1] * 50, [1] * 50, [1] * 10]
    # 1 − 0.1·0.5 − 0.05·2 = 0.85 ; 1 − 0.05 = 0.95 ; wrong: 0 − 0.1·0.1 = −0.01
    assert r(completions=comps, completion_ids=ids, solution=["7"] * 3) == pytest.approx([0.85, 0.95, -0.01])


def test_monotone_and_environment_columns():
    r = JointTeamReward(max_completion_len=100)
    out = r(completions=["a", "a", "a"], completion_ids=[[1]] * 3, team_quality=[0.8, 0.8, 0.9],
            team_latency=[2.0, 2.0, 2.0], team_messages=[1, 5, 1])
    # quality 0.8 − 0.1·2 − 0.05·1 = 0.55 ; more messages → 0.35 ; more quality → 0.65
    assert out == pytest.approx([0.55, 0.35, 0.65])


def test_edges_and_binding():
    out = joint_team_reward(completions=["", "x"], completion_ids=[[], [1]], solution=["7", None])
    assert out == [0.0, None]  # unbound: no time term ; no quality source → None
    (bound,) = bind_training_args([joint_team_reward], SimpleNamespace(max_completion_length=10))
    assert bound(completions=["<answer>7</answer>"], completion_ids=[[1] * 5], solution=["7"]) == pytest.approx([0.95])
    with pytest.raises(ValueError):
        JointTeamReward(lambda_time=-1)
