"""Reward functions are checked: a missing dataset column at construction, and an exception, a non-numeric or an
infinite reward at the call, each with the function's name and the fix; good values pass through unchanged."""

import math

import numpy as np
import pytest
import torch

from trl_groupx.reward_checks import check_reward_columns, checked_reward, missing_reward_columns, wrap_reward_funcs


def needs_answer(completions, answer, **kwargs):
    return [1.0 for _ in completions]


def test_good_values_pass_unchanged():
    fn = checked_reward(lambda completions, **kw: [1, 0.5, None, float("nan"), True, np.float32(2.0),
                                                   torch.tensor(3.0)], "ok")
    out = fn(completions=["a"] * 7)
    assert out[:3] == [1, 0.5, None] and math.isnan(out[3]) and out[4] is True


@pytest.mark.parametrize(
    "values, match",
    [
        (["1"], r"reward function 'bad' returned '1' \(str\) for completion 0; rewards must be numbers"),
        ([0.0, [1.0]], r"returned \[1.0\] \(list\) for completion 1"),
        ([float("inf")], r"returned inf for completion 0; rewards must be finite \(return None"),
        ([0.0, -math.inf], r"returned -inf for completion 1"),
        ("0.5", r"returned str; it must return a list"),
        (0.5, r"returned float; it must return a list"),
    ],
)
def test_bad_values_name_the_function_and_fix(values, match):
    with pytest.raises(ValueError, match=match):
        checked_reward(lambda **kw: values, "bad")(completions=["a"])


def test_exception_names_the_function():
    def broken(completions, **kwargs):
        raise KeyError("solution")

    with pytest.raises(RuntimeError, match=r"reward function 'broken' raised KeyError: 'solution'. Fix the function, "
                                           r"or return None") as info:
        checked_reward(broken, "broken")(completions=["a"])
    assert isinstance(info.value.__cause__, KeyError)


def test_wrapper_keeps_name_and_signature_and_skips_modules():
    (wrapped, module) = wrap_reward_funcs([needs_answer, torch.nn.Linear(1, 1)], ["needs_answer", "rm"])
    assert wrapped.__name__ == "needs_answer" and wrapped is not needs_answer
    assert missing_reward_columns(wrapped, ["prompt"]) == ["answer"]  # signature seen through the wrapper
    assert isinstance(module, torch.nn.Linear)


def test_missing_column_at_construction():
    assert missing_reward_columns(needs_answer, ["prompt", "answer"]) == []
    with pytest.raises(ValueError, match=r"reward function 'needs_answer' needs the dataset column\(s\) \['answer'\], "
                                         r"which train_dataset lacks \(columns: \['prompt'\]\)"):
        check_reward_columns([needs_answer], ["needs_answer"], ["prompt"])
    check_reward_columns([needs_answer], ["needs_answer"], None)  # iterable dataset: unknown columns, no check
    check_reward_columns([lambda completions, **kw: [], ], ["x"], ["prompt"])  # **kwargs-only functions pass
