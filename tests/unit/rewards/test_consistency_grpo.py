"""consistency_grpo: per-completion stability r = 1 − (−log p_i)/log n within a paraphrase group."""

import math

import pytest

from trl_groupx.rewards import stability_reward


def test_identical_answers_max_and_hand_values():
    comps = ["Plan B", "plan b!", "<answer>Plan B</answer>", "Plan C"]
    # group of 4 (one paraphrase id): "plan b" share 3/4, "plan c" share 1/4
    # r = 1 − (−log 0.75)/log 4 = 0.79248… ; 1 − log 4/log 4 = 0
    got = stability_reward(completions=comps, paraphrase_id=[7, 7, 7, 7])
    b = 1 - (-math.log(0.75)) / math.log(4)
    assert got == pytest.approx([b, b, b, 0.0])
    assert stability_reward(completions=["x", "x", "x"], paraphrase_id=[1, 1, 1]) == [1.0, 1.0, 1.0]
    # group mean = 1 − H/log n (the entropy form): H = −(0.75 log 0.75 + 0.25 log 0.25)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert sum(got) / 4 == pytest.approx(1 - h / math.log(4))


def test_groups_are_separate_and_fallbacks():
    comps = ["a", "b", "a", "a"]
    # ids [1, 1, 2, 2]: group 1 {a, b} → each 1 − log 2/log 2 = 0 ; group 2 {a, a} → 1
    assert stability_reward(completions=comps, paraphrase_id=[1, 1, 2, 2]) == pytest.approx([0, 0, 1, 1])
    # no paraphrase_id column: the prompt is the group key
    got = stability_reward(prompts=["p", "p", "q", "q"], completions=comps)
    assert got == pytest.approx([0, 0, 1, 1])
    # singleton group → 1 ; empty completions agree with each other ; conversational prompts and completions
    conv = [[{"role": "user", "content": "p"}]] * 2
    assert stability_reward(prompts=conv, completions=[[{"role": "assistant", "content": ""}]] * 2) == [1.0, 1.0]
    assert stability_reward(completions=["z"], paraphrase_id=[None], prompts=["p"]) == [1.0]
