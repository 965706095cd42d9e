"""MOTIF's round prompts and carried text (trl_groupx/rollouts/multi_round.py), built by hand from the official
`model_iteration` (purbeshmitra/MOTIF@4838e9ea:motif.py l.172-190), and the factory's argument checks."""

import pytest

from trl_groupx.rollouts.multi_round import (
    MOTIF_FINAL_NOTE,
    MOTIF_ROUND_TEMPLATE,
    extract_answer,
    make_multi_round_rollout,
    round_messages,
)

SYSTEM = {"role": "system", "content": "Solve it in rounds."}
PROMPT = [SYSTEM, {"role": "user", "content": "What is 2+3?"}]
ROUND_1 = "<reasoning>\nadd them\n</reasoning>\n<answer>\n2+3 is 5 so far\n</answer>\n"


def test_extract_answer_matches_official_extract_xml_answer():
    assert extract_answer(ROUND_1) == "2+3 is 5 so far"
    assert extract_answer("no tags here \n") == "no tags here"  # no tag: the whole text, stripped
    assert extract_answer("<answer> open only") == "open only"  # unclosed: to the end
    assert extract_answer("<answer>a</answer> <answer>b</answer>") == "b"  # the last tag


def test_round_two_of_three_carries_the_answer_of_round_one():
    # official l.179: prompt + ' Progress in round 1: "' + extract_xml_answer(r) + '"'; round 2 of 3 is not final
    msgs = round_messages(PROMPT, extract_answer(ROUND_1), finished_round=1, num_rounds=3)
    assert msgs == [SYSTEM, {"role": "user", "content": 'What is 2+3? Progress in round 1: "2+3 is 5 so far"'}]


def test_final_round_gets_the_final_note_and_only_the_latest_carry():
    # official l.179-182: the prompt restarts from the question each round (only round 2's carry), plus the note
    msgs = round_messages(PROMPT, "five", finished_round=2, num_rounds=3)
    assert msgs[-1]["content"] == ('What is 2+3? Progress in round 2: "five" Current round is the final (third) '
                                   "round. Provide a final answer.")
    assert "2+3 is 5 so far" not in msgs[-1]["content"]
    # two rounds: round 2 is final and named "second"
    assert round_messages(PROMPT, "x", 1, 2)[-1]["content"].endswith("final (second) round. Provide a final answer.")
    assert round_messages(PROMPT, "x", 11, 12)[-1]["content"].endswith("final (12th) round. Provide a final answer.")


def test_messages_after_the_question_are_dropped_and_text_prompts_stay_text():
    prompt = [SYSTEM, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "prefill"}]
    assert round_messages(prompt, "c", 1, 3) == [SYSTEM, {"role": "user", "content": 'Q Progress in round 1: "c"'}]
    assert round_messages("Q:", "c", 1, 3, template="{question} [{carry}]", final_note="") == "Q: [c]"
    with pytest.raises(ValueError, match="needs a user message"):
        round_messages([SYSTEM], "c", 1, 3)


def test_defaults_are_the_official_text():
    assert MOTIF_ROUND_TEMPLATE.format(question="Q", round=1, carry="A") == 'Q Progress in round 1: "A"'
    assert MOTIF_FINAL_NOTE.format(ordinal="third") == " Current round is the final (third) round. Provide a final answer."
    rollout = make_multi_round_rollout()
    assert (rollout.num_rounds, rollout.num_futures) == (3, 4)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_rounds": 0}, "num_rounds must be an integer >= 1"),
    ({"num_rounds": 2.0}, "num_rounds must be an integer >= 1"),
    ({"num_futures": 0}, "num_futures must be an integer >= 1"),
    ({"carry": "summary"}, "carry must be one of"),
    ({"template": "{question} only"}, r"template must contain \{carry\}"),
    ({"template": "{carry} {question} {oops}"}, "template may use only"),
    ({"future_model": "ref"}, "future_model must be 'policy'"),
    ({"future_temperature": 0.0}, "future_temperature must be > 0"),
    ({"future_top_p": 1.5}, r"future_top_p must be in \(0, 1\]"),
    ({"max_round_tokens": 0}, "max_round_tokens must be None"),
])
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_multi_round_rollout(**kwargs)


def test_custom_carry_callable_is_accepted():
    assert make_multi_round_rollout(carry=lambda t: t[-10:]).num_rounds == 3


def test_rollout_refuses_vllm():
    from types import SimpleNamespace

    rollout = make_multi_round_rollout(num_rounds=2)
    with pytest.raises(ValueError, match="use_vllm=False"):
        rollout([PROMPT], SimpleNamespace(use_vllm=True, args=SimpleNamespace(use_vllm=True)))


def test_recipe_arguments_reach_the_factory_and_are_refused_elsewhere():
    from types import SimpleNamespace

    from trl_groupx.script import _rollout_kwargs

    def script(rollout, **given):
        fields = dict(num_rounds=None, multi_round_futures=None, multi_round_future_model=None,
                      multi_round_max_tokens=None)
        return SimpleNamespace(rollout=rollout, **{**fields, **given})

    no_vllm = SimpleNamespace(use_vllm=False)
    assert _rollout_kwargs(script("multi_round", num_rounds=2, multi_round_futures=3), no_vllm) == {
        "num_rounds": 2, "num_futures": 3}
    assert _rollout_kwargs(script("counter_game"), no_vllm) == {}
    with pytest.raises(ValueError, match=r"\['num_rounds'\]: only for rollout: multi_round"):
        _rollout_kwargs(script("counter_game", num_rounds=2), no_vllm)
    with pytest.raises(ValueError, match="use_vllm: false"):
        _rollout_kwargs(script("multi_round"), SimpleNamespace(use_vllm=True))


def test_list_shows_motif_as_a_rollout_structure(capsys):
    from trl_groupx.cli import main

    main(["list"])
    out = capsys.readouterr().out
    assert "motif  [rollout]" in out and "rollout='multi_round'" in out and "purbeshmitra/MOTIF@4838e9ea" in out
    main(["list", "--stage", "advantages"])
    assert "motif" not in capsys.readouterr().out
