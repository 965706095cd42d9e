"""math_accuracy_reward (TRL's accuracy_reward wrapped), format rewards, DAPO soft overlong punishment."""

from types import SimpleNamespace

import pytest

from trl_groupx.rewards import (
    DAPOOverlongReward,
    TagFormatReward,
    bind_training_args,
    dapo_overlong_reward,
    math_accuracy_reward,
    math_equal,
    think_answer_format_reward,
    think_format_reward,
)


def conv(text):
    return [{"role": "assistant", "content": text}]


def test_math_accuracy_plain_and_conversational_and_none():
    plain = [r"so \boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}", "", r"\boxed{3}"]
    sol = [r"\frac{1}{3}", r"\frac{1}{3}", "3", None]
    assert math_accuracy_reward(completions=plain, solution=sol) == [1.0, 0.0, 0.0, None]
    assert math_accuracy_reward(completions=[conv(t) for t in plain], solution=sol) == [1.0, 0.0, 0.0, None]
    # no solution column at all → every row None
    assert math_accuracy_reward(completions=plain) == [None] * 4


def test_math_equal_accepts_bare_numbers_in_answers():
    # TRL's anchored extraction does not see a bare "4"; math_equal (math-verify default extraction) does
    assert math_equal(["4", "4.0", "five", "", "1/2"], ["4", "4", "5", "4", r"\frac{1}{2}"]) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert math_equal(["4"], [None]) == [None]


def test_tag_format():
    good = "<think>a</think>\n<answer>4</answer>"
    cases = [good, " " + good + " \n", "<think></think><answer>4</answer>", "<answer>4</answer>",
             good + " trailing", "<think>a</think><think>b</think><answer>4</answer>", ""]
    assert think_answer_format_reward(completions=cases) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    relaxed = TagFormatReward(("think", "answer"), allow_empty=True)
    assert relaxed(completions=["<think>\n\n</think><answer>4</answer>"]) == [1.0]
    assert think_answer_format_reward(completions=[conv(good)]) == [1.0]
    with pytest.raises(ValueError):
        TagFormatReward(())


def test_think_format_wraps_trl_for_plain_text():
    assert think_format_reward(completions=["<think>x</think>y", "<think>x"]) == [1.0, 0.0]


def test_dapo_overlong_eq13():
    # L_max = 100, L_cache = 20: |y| <= 80 → 0; 90 → (80 − 90)/20 = −0.5; 100 → −1; 101 → −1 (paper's third case)
    r = DAPOOverlongReward(max_completion_len=100, soft_punish_cache=20)
    assert r(completion_ids=[[1] * 0, [1] * 80, [1] * 90, [1] * 100, [1] * 101]) == [0.0, 0.0, -0.5, -1.0, -1.0]
    # verl's penalty_factor scales it: 0.5 · (−0.5) = −0.25
    assert DAPOOverlongReward(100, 20, penalty_factor=0.5)(completion_ids=[[1] * 90]) == [-0.25]


def test_dapo_overlong_binding_and_errors():
    with pytest.raises(ValueError, match="max_completion_len is unset"):
        dapo_overlong_reward(completion_ids=[[1]])
    (bound,) = bind_training_args([dapo_overlong_reward], SimpleNamespace(max_completion_length=10))
    assert dapo_overlong_reward.max_completion_len is None  # the registered instance is untouched
    # L_max 10 → L_cache = round(0.2 · 10) = 2: |y| = 9 → (8 − 9)/2 = −0.5
    assert bound(completion_ids=[[1] * 8, [1] * 9]) == [0.0, -0.5]
    with pytest.raises(ValueError):
        DAPOOverlongReward(100, 200)
    with pytest.raises(ValueError):
        DAPOOverlongReward(100, 20, penalty_factor=-1)
    with pytest.raises(ValueError, match="completion_ids"):
        DAPOOverlongReward(100, 20)(completions=["x"])


def test_answer_accuracy_reads_only_the_answer():
    from trl_groupx.rewards import answer_accuracy_reward

    comps = ["<think>maybe 5</think><answer>4</answer>", "<think>4</think><answer>5</answer>", "4", ""]
    assert answer_accuracy_reward(completions=comps, solution=["4", "4", "4", "4"]) == [1.0, 0.0, 1.0, 0.0]
    assert answer_accuracy_reward(completions=["4"], solution=[None]) == [None]
