"""tw_grpo: multi-choice partial credit |pred|/|gold| if pred ⊆ gold, else 0."""

from trl_groupx.rewards import multi_choice_partial_reward
from trl_groupx.rewards.tw_grpo import parse_options


def test_catalog_and_hand_values():
    comps = ["<answer>A,C</answer>", "<answer>A, B, C</answer>", "<answer>A</answer>", "<answer>A,D</answer>",
             "<answer>b,c,a</answer>"]
    gold = ["A,B,C"] * 5
    # 2 of 3 → 2/3 ; all → 1 ; 1 of 3 → 1/3 ; a wrong option → 0 ; order and case free → 1
    assert multi_choice_partial_reward(completions=comps, solution=gold) == [2 / 3, 1.0, 1 / 3, 0.0, 1.0]


def test_edges():
    out = multi_choice_partial_reward(
        completions=["", "<answer></answer>", [{"role": "assistant", "content": "B"}], "A", "A"],
        solution=["A", "A", ["B"], None, ""],
    )
    assert out == [0.0, 0.0, 1.0, None, None]  # empty answers 0 ; list gold ; None / empty gold → None
    assert parse_options(" a , ,c ") == {"A", "C"}
    assert multi_choice_partial_reward(completions=["A"]) == [None]
