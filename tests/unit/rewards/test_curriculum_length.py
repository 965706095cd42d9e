"""curriculum_length: budget schedule, triangular length term, correctness independent of length, trainer_state."""

import itertools
from types import SimpleNamespace

import pytest

from trl_groupx.rewards import CurriculumLengthReward, budget_schedule, curriculum_length_reward

GOOD = "<think>2+2</think><answer>4</answer>"


def test_budget_schedule_paper_values():
    # B(t) = max(1, floor(256 · 0.7^floor(t/150))): 256, 179 (179.2), 125 (125.44), 87 (87.808)
    assert [budget_schedule(t) for t in (0, 149, 150, 300, 450, 599)] == [256, 256, 179, 125, 87, 87]
    seq = [budget_schedule(t, interval=1) for t in range(40)]
    assert all(a >= b for a, b in itertools.pairwise(seq)) and seq[-1] == 1  # monotone, down to b_min = 1
    assert budget_schedule(10**6, b_min=87) == 87
    # linear (our choice): 256 − (256 − 56) · 50/100 = 156
    assert budget_schedule(50, b_min=56, schedule="linear", max_steps=100) == 156
    assert budget_schedule(500, b_min=56, schedule="linear", max_steps=100) == 56
    with pytest.raises(ValueError):
        budget_schedule(-1)
    with pytest.raises(ValueError, match="max_steps"):
        budget_schedule(3, schedule="linear")


def test_length_score_triangle():
    f = CurriculumLengthReward.length_score
    assert (f(0, 100), f(50, 100), f(100, 100), f(150, 100), f(200, 100), f(300, 100)) == (0, 0.5, 1, 0.5, 0, 0)


def test_reward_values_and_step():
    r = CurriculumLengthReward(b0=10, gamma=0.5, interval=2)  # budgets 10, 10, 5, 5, 2, ...
    state0, state2 = SimpleNamespace(global_step=0, max_steps=10), SimpleNamespace(global_step=2, max_steps=10)
    comps = [GOOD, GOOD, "4", GOOD]
    ids = [[1] * 10, [1] * 15, [1] * 10, [1] * 5]
    sol = ["4", "4", "4", "5"]
    # step 0, B = 10: 0.6·1 + 0.3·1 + 0.1·1 = 1.0 ; 0.6 + 0.3·0.5 + 0.1 = 0.85 ; no tags: "4" still correct →
    # 0.6 + 0.3 + 0 = 0.9 ; wrong answer: 0 + 0.3·0.5 + 0.1 = 0.25
    assert curriculum_length_reward.__class__ is CurriculumLengthReward
    got = r(completions=comps, completion_ids=ids, solution=sol, trainer_state=state0)
    assert got == pytest.approx([1.0, 0.85, 0.9, 0.25])
    # step 2, B = 5: 10 tokens is now 2B → length 0 (correctness unchanged): 0.7 ; 15 → 0.7 ; "4" → 0.6 ; 5 tokens → 0.4
    got = r(completions=comps, completion_ids=ids, solution=sol, trainer_state=state2)
    assert got == pytest.approx([0.7, 0.7, 0.6, 0.4])


def test_edge_cases_and_logging():
    logged = {}
    r = CurriculumLengthReward(b0=4)
    out = r(completions=["", [{"role": "assistant", "content": GOOD}]], completion_ids=[[], [1] * 4],
            solution=[None, "4"], log_metric=lambda k, v: logged.setdefault(k, v))
    # empty completion, no solution: correctness 0, length 0 (n = 0), format 0 → 0 ; conversational good → 1
    assert out == pytest.approx([0.0, 1.0])
    assert logged == {"curriculum_length/budget": 4.0}  # no trainer_state → step 0 → B0
    with pytest.raises(ValueError, match="completion_ids"):
        r(completions=["x"], solution=["1"])
    for bad in ({"b0": 0}, {"gamma": 0.0}, {"interval": 0}, {"b0": 4, "b_min": 5}, {"schedule": "cosine"}):
        with pytest.raises(ValueError):
            CurriculumLengthReward(**bad)
