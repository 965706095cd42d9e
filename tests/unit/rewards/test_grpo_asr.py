"""grpo_asr: r = max(0, 1 − WER)."""

import pytest

from trl_groupx.rewards import WERReward, wer, wer_reward


def test_catalog_checks():
    ref = "the cat sat down"
    # identical → WER 0 → 1 ; one substitution in 4 words → 1 − 1/4 = 0.75
    assert wer_reward(completions=[ref, "the dog sat down"], reference=[ref, ref]) == [1.0, 0.75]


def test_hand_counts():
    # deletion + insertion: "the sat down now" vs "the cat sat down": delete "cat", insert "now" → 2/4
    assert wer("the sat down now", "the cat sat down") == 0.5
    # normalisation: case and punctuation ignored
    assert wer("The cat, sat down!", "the cat sat down") == 0.0
    # unnormalised: "The"≠"the", "cat,"≠"cat", "down!"≠"down" → 3/4
    assert wer("The cat, sat down!", "the cat sat down", normalize=False) == 0.75
    assert wer("", "") == 0.0 and wer("a b", "") == 2.0


def test_edges():
    out = wer_reward(
        completions=["", "<answer>hello world</answer> extra", [{"role": "assistant", "content": "hello"}],
                     "a b c d e f g h", "x"],
        reference=["hello world", "hello world", "hello world", "hello", None],
    )
    # empty → WER 1 → 0 ; answer tag used → 1 ; conversational deletion 1/2 → 0.5 ; 7 insertions +1 sub → clipped 0
    assert out == [0.0, 1.0, 0.5, 0.0, None]
    assert wer_reward(completions=["x"], solution=["x"]) == [1.0]  # alias column
    assert wer_reward(completions=["x"]) == [None]  # no column
    assert WERReward(answer_tag=None)(completions=["<answer>a</answer>"], reference=["answer a answer"]) == [1.0]


def test_wrong_column_length():
    with pytest.raises(ValueError, match="reference"):
        wer_reward(completions=["a", "b"], reference=["a"])
