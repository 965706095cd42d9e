"""Verbalised-confidence Brier reward (trl_groupx/rewards/confidence.py)."""

import pytest

from trl_groupx.rewards import REWARD_FUNCS, confidence_brier_reward, parse_confidence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<confidence>0.8</confidence>", 0.8),
        ("<confidence> 80% </confidence>", 0.8),
        ("<confidence>1</confidence>", 1.0),
        ("<confidence>.25</confidence>", 0.25),
        ("<confidence>1.5</confidence>", None),  # out of range
        ("<confidence>high</confidence>", None),
        ("<confidence>0.8", None),  # truncated
        ("no tag", None),
    ],
)
def test_parse_confidence(text, expected):
    assert parse_confidence(text) == expected


def test_brier_reward_hand_derived():
    completions = [
        "<answer>4</answer><confidence>0.9</confidence>",  # right, q 0.9 → 1 − 0.1² = 0.99
        "<answer>5</answer><confidence>0.9</confidence>",  # wrong, q 0.9 → 1 − 0.9² = 0.19
        "<answer>5</answer><confidence>0.2</confidence>",  # wrong, q 0.2 → 1 − 0.04 = 0.96
        "<answer>4</answer>",  # no confidence → 0
        "<answer>4</answer><confidence>0.5</confidence>",  # no gold → None
    ]
    scores = confidence_brier_reward(completions=completions, solution=["4", "4", "4", "4", None])
    assert scores[:4] == pytest.approx([0.99, 0.19, 0.96, 0.0])
    assert scores[4] is None


def test_reads_the_toy_answer_column_and_is_registered():
    assert confidence_brier_reward(completions=["<answer>19</answer><confidence>1</confidence>"],
                                   answer=["19"]) == [1.0]
    assert REWARD_FUNCS["confidence_brier_reward"] is confidence_brier_reward
    assert confidence_brier_reward.toy_task  # kept by `trl-groupx grpo --toy` as the second block's reward
