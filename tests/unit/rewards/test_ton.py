"""ton: thought dropout transform and the format reward that accepts an empty thought."""

import pytest
from datasets import Dataset

from trl_groupx.rewards import drop_thought, thought_dropout, ton_format_reward
from trl_groupx.rewards.ton import EMPTY_THOUGHT

ROWS = [{"prompt": f"q{i}", "completion": f"<think>step {i}</think><answer>{i}</answer>"} for i in range(40)]


def test_dropout_extremes_and_rate():
    assert thought_dropout(ROWS, p=0.0) == ROWS  # identity
    dropped = thought_dropout(ROWS, p=1.0)
    assert all(r["completion"] == f"{EMPTY_THOUGHT}<answer>{i}</answer>" for i, r in enumerate(dropped))
    half = thought_dropout(ROWS, p=0.5, seed=3)
    n = sum(EMPTY_THOUGHT in r["completion"] for r in half)
    assert 0 < n < 40 and half == thought_dropout(ROWS, p=0.5, seed=3)  # deterministic given the seed
    assert ROWS[0]["completion"].startswith("<think>step")  # input not mutated
    with pytest.raises(ValueError):
        thought_dropout(ROWS, p=1.5)


def test_dropout_on_datasets_and_conversational_targets():
    ds = Dataset.from_list(ROWS[:4])
    out = thought_dropout(ds, p=1.0)
    assert out["completion"][0] == f"{EMPTY_THOUGHT}<answer>0</answer>"
    conv = [{"completion": [{"role": "user", "content": "<think>keep</think>"},
                            {"role": "assistant", "content": "<think>a</think><think>b</think>x"}]}]
    (row,) = thought_dropout(conv, p=1.0)
    assert row["completion"][0]["content"] == "<think>keep</think>"
    assert row["completion"][1]["content"] == EMPTY_THOUGHT * 2 + "x"
    assert drop_thought("no thought") == "no thought"


def test_format_reward_accepts_empty_thought():
    comps = ["<think>\n\n</think><answer>4</answer>", "<think></think> <answer>4</answer>",
             "<think>long reasoning</think>\n<answer>4</answer>", "<answer>4</answer>", "",
             "<think>a</think><answer>4</answer><think>b</think>",
             [{"role": "assistant", "content": "<think>\n\n</think><answer>x</answer>"}]]
    assert ton_format_reward(completions=comps) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
