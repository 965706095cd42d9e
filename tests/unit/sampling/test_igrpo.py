"""iGRPO's pure parts: best-draft selection (ties, NaN, all-zero, one and two drafts), the stage-2 prompt, the index
bookkeeping that finds each prompt's drafts in the gathered list (groups split across processes, G = 1 and 2),
the keep-all filter, and the config-time refusals."""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.best_draft import draft_positions, group_first_rows
from trl_groupx.sampling.igrpo import IGRPO_DRAFT_TEMPLATE, best_draft_indices, conditioned_prompt, igrpo

NAN = float("nan")


def config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **flags)


# ---- best-draft selection -------------------------------------------------------------------------------------


def test_best_draft_is_the_argmax_with_ties_to_the_lowest_index():
    rewards = torch.tensor([
        [0.0, 1.0, 0.5],  # clear maximum at 1
        [1.0, 1.0, 0.0],  # tie between 0 and 1 -> 0
        [0.2, 0.7, 0.7],  # tie between 1 and 2 -> 1
        [0.0, 0.0, 0.0],  # every draft scored 0 -> draft 0 (still appended)
        [-1.0, -0.5, -2.0],  # negative rewards: the largest is -0.5 -> 1
    ])
    assert best_draft_indices(rewards).tolist() == [1, 0, 1, 0, 1]


def test_nan_drafts_are_never_chosen_and_an_all_nan_prompt_gets_no_draft():
    rewards = torch.tensor([
        [NAN, 0.2, 0.2],  # NaN first: the scored tie 0.2/0.2 -> 1
        [NAN, NAN, -3.0],  # only draft 2 is scored, even though it is negative -> 2
        [NAN, NAN, NAN],  # nothing scored -> -1
        [1.0, NAN, 1.0],  # NaN between tied maxima -> 0
    ])
    assert best_draft_indices(rewards).tolist() == [1, 2, -1, 0]


def test_one_and_two_drafts():
    # k = 1: the only draft, unless it is unscored
    assert best_draft_indices(torch.tensor([[0.3], [NAN], [0.0]])).tolist() == [0, -1, 0]
    # k = 2: (0.5, 0.5) tie -> 0; (NaN, 0) -> 1; (0, 1) -> 1
    assert best_draft_indices(torch.tensor([[0.5, 0.5], [NAN, 0.0], [0.0, 1.0]])).tolist() == [0, 1, 1]


def test_infinite_draft_rewards_fail_clearly():
    with pytest.raises(ValueError, match="igrpo.*inf"):
        best_draft_indices(torch.tensor([[0.0, float("inf")]]))
    with pytest.raises(ValueError, match="igrpo.*inf"):
        best_draft_indices(torch.tensor([[float("-inf"), 0.0]]))
    with pytest.raises(ValueError, match="num_drafts >= 1"):
        best_draft_indices(torch.zeros(2, 0))


# ---- stage-2 prompt -------------------------------------------------------------------------------------------


def test_text_prompt_is_the_prompt_followed_by_the_filled_template():
    assert conditioned_prompt("2+2=", "5", "|{draft}|") == "2+2=|5|"
    expected = "2+2=\n\nA previous attempt:\n5\n\nImprove on this attempt and give your final answer."
    assert conditioned_prompt("2+2=", "5") == expected


def test_conversational_prompt_appends_to_the_last_user_message_only():
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]
    out = conditioned_prompt(prompt, r"$\boxed{5}$ {not a field}", " Draft: {draft}")
    assert out == [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": r"2+2= Draft: $\boxed{5}$ {not a field}"}]  # braces kept verbatim
    assert prompt[-1]["content"] == "2+2="  # the dataset row is not modified
    # several user turns: only the last one gets the draft; messages after it are kept
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "assistant", "content": "prefix"}]
    out = conditioned_prompt(chat, "d", "+{draft}")
    assert [m["content"] for m in out] == ["a", "b", "c+d", "prefix"]


def test_content_blocks_get_a_text_block_and_prompts_without_a_user_fail():
    prompt = [{"role": "user", "content": [{"type": "text", "text": "2+2="}]}]
    out = conditioned_prompt(prompt, "4", " [{draft}]")
    assert out[0]["content"] == [{"type": "text", "text": "2+2="}, {"type": "text", "text": " [4]"}]
    with pytest.raises(ValueError, match="user message"):
        conditioned_prompt([{"role": "system", "content": "x"}], "4")


# ---- where each prompt's drafts are in the gathered list ------------------------------------------------------


def test_group_first_rows():
    assert group_first_rows(8, 0, 4) == [0, 4]
    assert group_first_rows(2, 2, 4) == []  # second half of a split group: drafted by the other process
    assert group_first_rows(6, 6, 4) == [2]  # global rows 6..11: row 8 opens a group
    assert group_first_rows(3, 0, 1) == [0, 1, 2]  # G = 1: every row is its own group


def test_draft_positions_one_process():
    # 8 rows, G = 4, k = 3: rows 0 and 4 open groups; their drafts are list entries 0..2 and 3..5
    assert draft_positions(1, 8, 4, 3, 6).tolist() == [[0, 1, 2], [3, 4, 5]]
    # G = 1, k = 2: three prompts, two drafts each
    assert draft_positions(1, 3, 1, 2, 6).tolist() == [[0, 1], [2, 3], [4, 5]]


def test_draft_positions_across_processes():
    # 2 processes x 2 rows, G = 4: one group split across them; process 0 drafts it (k = 3), process 1 only pads
    # to 3 entries, so the gathered list is [p0 d0, p0 d1, p0 d2, p1 filler x3]
    assert draft_positions(2, 2, 4, 3, 3).tolist() == [[0, 1, 2]]
    # 2 processes x 4 rows, G = 2, k = 2: each process drafts its two groups, 4 entries each
    assert draft_positions(2, 4, 2, 2, 4).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # 2 processes x 6 rows, G = 4, k = 1: groups start at global rows 0, 4 (process 0) and 8 (process 1, local
    # row 2); process 0 drafts 2, process 1 drafts 1 padded to 2 -> entries 0, 1 and 2
    assert draft_positions(2, 6, 4, 1, 2).tolist() == [[0], [1], [2]]


# ---- the stage's filter ---------------------------------------------------------------------------------------


def test_filter_keeps_every_rollout_including_unscored_ones():
    batch = RolloutBatch(torch.tensor([1.0, 0.0, NAN, 0.0]), torch.tensor([3, 0, 2, 5]), 2)
    assert igrpo(batch).tolist() == [True] * 4
    with pytest.raises(ValueError, match="igrpo.*inf"):
        igrpo(RolloutBatch(torch.tensor([1.0, float("inf")]), torch.tensor([1, 1]), 2))


# ---- config-time refusals -------------------------------------------------------------------------------------


def test_defaults_and_valid_values():
    c = config(rollout_filter="igrpo")
    assert c.igrpo_num_drafts is None and c.igrpo_draft_template == IGRPO_DRAFT_TEMPLATE
    assert config(rollout_filter="igrpo", igrpo_num_drafts=1).igrpo_num_drafts == 1


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "4"])
def test_bad_num_drafts_fail_at_construction(bad):
    with pytest.raises(ValueError, match="igrpo_num_drafts.*integer >= 1"):
        config(rollout_filter="igrpo", igrpo_num_drafts=bad)


def test_template_without_the_draft_field_fails():
    with pytest.raises(ValueError, match=r"igrpo_draft_template.*\{draft\}"):
        config(rollout_filter="igrpo", igrpo_draft_template="Try again.")


def test_vllm_is_refused():
    with pytest.raises(ValueError, match="igrpo.*use_vllm=False"):
        config(rollout_filter="igrpo", use_vllm=True)


def test_advantage_variants_keyed_by_prompt_tokens_are_refused():
    with pytest.raises(ValueError, match="advantage_estimator='spo_single'.*igrpo"):
        config(rollout_filter="igrpo", advantage_estimator="spo_single")
    assert config(rollout_filter="igrpo", advantage_estimator="rloo").advantage_estimator == "rloo"


def test_igrpo_fields_without_the_variant_fail():
    with pytest.raises(ValueError, match="igrpo_num_drafts=2 belongs to variant 'igrpo'"):
        config(igrpo_num_drafts=2)
