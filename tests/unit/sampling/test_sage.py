"""SAGE's pure parts: the hint request, hint parsing, the hinted prompt (text and chat), the solved-group test, the
level escalation, references, the filter and the config refusals."""

import math
from types import SimpleNamespace

import pytest
import torch

from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.sage import (
    SAGE_HINT_INSTRUCTION,
    SAGE_HINT_REQUEST_TEMPLATE,
    SAGE_HINT_TEMPLATE,
    hint_request,
    hinted_prompt,
    level_targets,
    parse_hint_levels,
    question_text,
    reference_text,
    sage,
    solved_groups,
    validate,
)

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]


def test_hint_request_chat_is_system_instruction_then_question_and_solution():
    assert hint_request(CHAT, "2+3=5, so 5") == [
        {"role": "system", "content": SAGE_HINT_INSTRUCTION},
        {"role": "user", "content": "Question:\nWhat is 2+3?\n\nSolution:\n2+3=5, so 5\n"},
    ]


def test_hint_request_text_prompt_is_one_text():
    request = hint_request("  Compute {x}. ", "x = {1}", "I", "Q={question} S={solution}")
    assert request == "I\n\nQ=Compute {x}. S=x = {1}"


def test_question_text_of_content_blocks_and_missing_user():
    blocks = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text",
                                                                                               "text": "b"}]}]
    assert question_text(blocks) == "ab"
    with pytest.raises(ValueError, match="user message"):
        question_text([{"role": "system", "content": "x"}])


def test_hinted_prompt_text_chat_and_blocks():
    assert hinted_prompt("Q?", "think of parity") == "Q?\n\nHere is a hint to help you:\nthink of parity"
    hinted = hinted_prompt(CHAT, "h{1}", " [{hint}]")
    assert hinted == [CHAT[0], {"role": "user", "content": "What is 2+3? [h{1}]"}]
    assert CHAT[1]["content"] == "What is 2+3?"  # the row's prompt is not modified
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Q"}]}]
    assert hinted_prompt(blocks, "h", "+{hint}")[0]["content"][-1] == {"type": "text", "text": "+h"}
    with pytest.raises(ValueError, match="user message"):
        hinted_prompt([{"role": "system", "content": "x"}], "h")


@pytest.mark.parametrize("reply, expected", [
    ('```json\n{"level_1": " a ", "level_2": "b", "level_3": "c"}\n```', {"level_1": "a", "level_2": "b",
                                                                        "level_3": "c"}),
    ('Sure! {"level_1": "a", "level_3": "c"} done', {"level_1": "a", "level_3": "c"}),
    ('{"level_1": "", "level_2": 7, "level_3": "c", "other": "x"}', {"level_3": "c"}),
    ('{"level_1": "  "}', None),
    ("no json here", None),
    ("[1, 2]", None),
    ('{"level_1": "a",}', None),  # not JSON (the official parser's json5 would accept the trailing comma)
])
def test_parse_hint_levels(reply, expected):
    assert parse_hint_levels(reply) == expected


@pytest.mark.parametrize("value, expected", [(None, None), (float("nan"), None), ("", None), ("  \n", None),
                                             (" 25 ", "25"), (25, "25"), (2.5, "2.5")])
def test_reference_text(value, expected):
    assert reference_text(value) == expected


def test_solved_groups_by_hand():
    # G = 4: group 0 has a 1 (> 0) -> solved; group 1 all 0 -> unsolved; group 2 only NaN and -1 -> unsolved
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("nan"), -1.0, float("nan"), 0.0])
    assert solved_groups(rewards, 4).tolist() == [True, False, False]
    # threshold 0.5: 0.5 is not strictly above it
    assert solved_groups(torch.tensor([0.5, 0.5, 0.6, 0.0]), 2, 0.5).tolist() == [False, True]
    # G = 2 and all-equal groups: (1, 1) solved, (0, 0) not
    assert solved_groups(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2).tolist() == [True, False]
    # G = 1: each rollout is its own group
    assert solved_groups(torch.tensor([0.0, 2.0]), 1).tolist() == [False, True]
    with pytest.raises(ValueError, match="inf"):
        solved_groups(torch.tensor([float("inf"), 0.0]), 2)


def test_level_targets_escalate_only_unsolved_groups_with_that_level():
    solved = torch.tensor([True, False, False, False])
    hints = [{"level_1": "a"}, {"level_1": "a", "level_2": "b"}, None, {"level_2": "b"}]
    assert level_targets(solved, hints, "level_1") == [1]  # group 3 has no level 1: it skips to level 2
    assert level_targets(solved, hints, "level_2") == [1, 3]
    assert level_targets(solved, hints, "level_3") == []


def test_filter_keeps_every_rollout_and_refuses_inf():
    keep = sage(RolloutBatch(torch.tensor([0.0, float("nan"), 1.0, 0.0]), None, 2))
    assert keep.tolist() == [True] * 4
    with pytest.raises(ValueError, match="inf"):
        sage(RolloutBatch(torch.tensor([0.0, float("-inf")]), None, 2))


def _config(**overrides):
    fields = dict(sage_column="solution", sage_hint_instruction=SAGE_HINT_INSTRUCTION,
                  sage_hint_request_template=SAGE_HINT_REQUEST_TEMPLATE, sage_hint_template=SAGE_HINT_TEMPLATE,
                  sage_success_threshold=0.0, use_vllm=False, advantage_estimator="grpo", sage_method="sage",
                  sage_light_accuracy_min=0.0, sage_light_accuracy_max=0.35)
    return SimpleNamespace(**{**fields, **overrides})


@pytest.mark.parametrize("overrides, match", [
    (dict(sage_column=""), "sage_column=''.*reference solution"),
    (dict(sage_hint_instruction=" "), "sage_hint_instruction"),
    (dict(sage_hint_request_template="Q: {question}"), "sage_hint_request_template.*'{solution}'"),
    (dict(sage_hint_template="hint"), "sage_hint_template.*'{hint}'"),
    (dict(sage_success_threshold=math.nan), "sage_success_threshold"),
    (dict(sage_success_threshold=True), "sage_success_threshold"),
    (dict(use_vllm=True), "use_vllm=False"),
    (dict(advantage_estimator="spo_single"), "per-prompt state"),
])
def test_validate_refuses_bad_flags(overrides, match):
    with pytest.raises(ValueError, match=match):
        validate(_config(**overrides))


def test_validate_accepts_defaults_and_other_estimators():
    validate(_config())
    validate(_config(advantage_estimator="rloo"))
