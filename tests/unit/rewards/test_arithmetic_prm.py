"""The rule-based arithmetic PRM: leading-character partial credit against the reference answer."""

import pytest

from trl_groupx.rewards import REWARD_FUNCS, arithmetic_prefix_prm


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("19", "19", 1.0),  # exact
        (" 19\n", "19", 1.0),  # surrounding whitespace stripped
        ("1", "19", 0.5),  # first digit right, second missing: 1 / max(1, 2)
        ("197", "19", 2 / 3),  # right prefix, extra digit costs: 2 / max(3, 2)
        ("18", "19", 0.5),  # first digit right: 1 / 2
        ("91", "19", 0.0),  # first digit wrong: nothing after it counts
        ("", "19", 0.0),  # empty completion
        ("7", "7", 1.0),
    ],
)
def test_scores(completion, answer, score):
    assert arithmetic_prefix_prm(completions=[completion], answer=[answer]) == [pytest.approx(score)]


def test_conversational_missing_answer_and_registration():
    conv = [[{"role": "assistant", "content": "12"}]]
    assert arithmetic_prefix_prm(completions=conv, answer=["12"]) == [1.0]
    assert arithmetic_prefix_prm(completions=["3"], answer=[None]) == [None]  # unscored → TRL NaN
    assert arithmetic_prefix_prm(completions=["3"]) == [None]  # no answer column
    assert arithmetic_prefix_prm(completions=[], answer=[]) == []
    assert REWARD_FUNCS["arithmetic_prefix_prm"] is arithmetic_prefix_prm
    assert arithmetic_prefix_prm.toy_task  # kept by `trl-groupx grpo --toy`
