"""EDGE-GRPO Guided Error Correction: which responses are corrected, the branch split, the corrected token ids and
their text (plain and chat), config refusals."""

import pytest
import torch

import trl_groupx
from trl_groupx.sampling._scoring import as_completions
from trl_groupx.sampling.edge_grpo_gec import (
    ANSWER,
    REFLECT,
    SOLUTION,
    answer_suffix,
    assign_branches,
    branch_uniforms,
    corrected_ids,
    reflect_prefix,
    rows_to_correct,
)

NAN = float("nan")


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "num_generations": 4,
            "per_device_train_batch_size": 8, "edge_grpo_gec": True}
    return trl_groupx.GRPOConfig(**{**base, **kw})


# ---- which responses ----------------------------------------------------------------------------------------------


def test_every_response_below_the_target_is_selected_in_every_group_g8():
    # official target 2 (format + accuracy): 2 = correct; 1 (format only), 0, 1.5 are corrected; NaN (unscored) is
    # left alone; group 0 is mixed, group 1 all-fail: both get their wrong rows selected (not only all-fail groups).
    rewards = torch.tensor([2, 1, 0, 2, 1.5, 2, NAN, 0, 0, 1, 0, 0, 1, 1, 0, NAN])
    selected = rows_to_correct(rewards, torch.full((16,), 10), 2.0, 256)
    assert selected.tolist() == [False, True, True, False, True, False, False, True,
                                 True, True, True, True, True, True, True, False]


def test_group_size_2_and_target_1():
    rewards = torch.tensor([1.0, 0.0, NAN, 0.0])
    assert rows_to_correct(rewards, torch.tensor([5, 5, 5, 5]), 1.0, 256).tolist() == [False, True, False, True]


def test_long_prompts_are_never_corrected():
    # official: prompt length < 256 tokens; 255 is corrected, 256 is not
    rewards = torch.zeros(4)
    selected = rows_to_correct(rewards, torch.tensor([255, 256, 10, 300]), 2.0, 256)
    assert selected.tolist() == [True, False, True, False]


def test_all_correct_and_all_nan_batches_select_nothing():
    assert not rows_to_correct(torch.full((4,), 2.0), torch.ones(4), 2.0, 256).any()
    assert not rows_to_correct(torch.full((4,), NAN), torch.ones(4), 2.0, 256).any()


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="edge_grpo_gec=True got ±inf"):
        rows_to_correct(torch.tensor([0.0, float("inf")]), torch.ones(2), 2.0, 256)


# ---- branch split -------------------------------------------------------------------------------------------------


def test_branches_from_hand_uniforms():
    # answer share 0.25, solution 0.25: [0, .25) answer, [.25, .5) solution, [.5, 1) reflect
    u = torch.tensor([0.0, 0.2499, 0.25, 0.4999, 0.5, 0.99])
    assert assign_branches(u, 0.25, 0.25).tolist() == [ANSWER, ANSWER, SOLUTION, SOLUTION, REFLECT, REFLECT]
    assert assign_branches(u, 0.0, 1.0).tolist() == [SOLUTION] * 6
    assert assign_branches(u, 0.0, 0.0).tolist() == [REFLECT] * 6


def test_official_split_counts_are_50_25_25():
    # 40000 iid draws: each count within 4 standard deviations (sqrt(40000 · .25 · .75) ≈ 87) of 10000/10000/20000
    branch = assign_branches(branch_uniforms(40000, seed=0, step=3), 0.25, 0.25)
    counts = torch.bincount(branch, minlength=3).tolist()
    assert abs(counts[ANSWER] - 10000) < 350 and abs(counts[SOLUTION] - 10000) < 350
    assert abs(counts[REFLECT] - 20000) < 400


def test_uniforms_are_the_same_for_the_same_step_and_differ_across_steps():
    assert torch.equal(branch_uniforms(8, 1, 5), branch_uniforms(8, 1, 5))
    assert not torch.equal(branch_uniforms(8, 1, 5), branch_uniforms(8, 1, 6))


# ---- corrected responses ------------------------------------------------------------------------------------------


def test_answer_template_is_the_official_text():
    assert answer_suffix("42") == ("\nWait! Something is wrong here. After verification, the correct answer is "
                                   "\\boxed{42}.")


def test_answer_branch_keeps_the_sampled_tokens_drops_their_eos_and_appends_suffix_and_eos(tokenizer):
    eos = tokenizer.eos_token_id
    sampled = tokenizer("7 + 5 = 11", add_special_tokens=False)["input_ids"]
    suffix = tokenizer(answer_suffix("12"), add_special_tokens=False)["input_ids"]
    ids = corrected_ids(ANSWER, sampled + [eos], "12", tokenizer, [eos], max_length=200)
    assert ids == sampled + suffix + [eos]
    assert tokenizer.decode(ids, skip_special_tokens=True).endswith("the correct answer is \\boxed{12}.")
    # no room: the sampled tokens are cut from the end so that suffix + EOS fit (room for 3 sampled tokens)
    tight = corrected_ids(ANSWER, sampled + [eos], "12", tokenizer, [eos], max_length=len(suffix) + 4)
    assert tight == sampled[:3] + suffix + [eos]
    # shorter than the suffix itself: cut at the end, no EOS
    assert corrected_ids(ANSWER, sampled, "12", tokenizer, [eos], max_length=5) == suffix[:5]
    # a custom template
    short = corrected_ids(ANSWER, sampled, "12", tokenizer, [eos], max_length=64, template="!{answer}")
    assert short == sampled + tokenizer("!12", add_special_tokens=False)["input_ids"] + [eos]


def test_solution_branch_is_the_reference_and_eos_cut_to_max_length(tokenizer):
    eos = tokenizer.eos_token_id
    ref = tokenizer("12", add_special_tokens=False)["input_ids"]
    assert corrected_ids(SOLUTION, [5, 6, eos], "12", tokenizer, [eos], max_length=64) == ref + [eos]
    assert corrected_ids(SOLUTION, [5], "12 is the answer", tokenizer, [eos], max_length=2) == tokenizer(
        "12 is the answer", add_special_tokens=False)["input_ids"][:2]
    with pytest.raises(ValueError):
        corrected_ids(REFLECT, [5], "12", tokenizer, [eos], max_length=8)


def test_reflect_prefix_keeps_room_for_the_cue_and_one_token():
    eos, pad, cue = 0, 9, [7, 8]
    # trailing EOS/pad dropped, then the cue: 3 + 2 = 5 <= 8 - 1
    assert reflect_prefix([1, 2, 3, eos], cue, [eos, pad], max_length=8) == [1, 2, 3, 7, 8]
    # max_length 5: at most 5 - 2 - 1 = 2 sampled tokens kept, the last ones dropped
    assert reflect_prefix([1, 2, 3, 4, eos, pad], cue, [eos, pad], max_length=5) == [1, 2, 7, 8]
    # an empty response: the cue alone; a cue longer than the budget: nothing sampled is kept, the cue is cut so
    # that one generated token fits
    assert reflect_prefix([eos], cue, [eos, pad], max_length=8) == cue
    assert reflect_prefix([1, 2], cue, [eos, pad], max_length=3) == cue
    assert reflect_prefix([1, 2], cue, [eos, pad], max_length=2) == [7]
    assert reflect_prefix([1, 2], cue, [eos, pad], max_length=1) == []


class _Trainer:
    def __init__(self, tokenizer):
        self.processing_class = tokenizer


def test_rewards_see_the_corrected_text_plain_and_chat(tokenizer):
    eos = tokenizer.eos_token_id
    ids = corrected_ids(ANSWER, tokenizer("x", add_special_tokens=False)["input_ids"], "3", tokenizer, [eos], 200)
    text = "x" + answer_suffix("3")
    assert as_completions(_Trainer(tokenizer), ["1 + 2 ="], [ids]) == [text]
    chat = as_completions(_Trainer(tokenizer), [[{"role": "user", "content": "1 + 2 ="}]], [ids])
    assert chat == [[{"role": "assistant", "content": text}]]


# ---- config -------------------------------------------------------------------------------------------------------


def test_defaults_are_the_official_values():
    cfg = _config()
    assert (cfg.edge_grpo_gec_answer_share, cfg.edge_grpo_gec_solution_share) == (0.25, 0.25)
    assert (cfg.edge_grpo_gec_target_reward, cfg.edge_grpo_gec_max_prompt_tokens) == (2.0, 256)
    assert (cfg.edge_grpo_gec_answer_column, cfg.edge_grpo_gec_solution_column) == ("answer", "solution")
    assert cfg.edge_grpo_gec_reflect_cue == " Wait! Something is wrong here."
    assert cfg.edge_grpo_gec_reflect_max_new_tokens == 256


@pytest.mark.parametrize("kw, match", [
    ({"edge_grpo_gec_answer_share": 0.8, "edge_grpo_gec_solution_share": 0.3}, "sum <= 1"),
    ({"edge_grpo_gec_answer_share": -0.1}, "edge_grpo_gec_answer_share"),
    ({"edge_grpo_gec_target_reward": float("nan")}, "edge_grpo_gec_target_reward"),
    ({"edge_grpo_gec_max_prompt_tokens": 0}, "edge_grpo_gec_max_prompt_tokens"),
    ({"edge_grpo_gec_solution_column": ""}, "edge_grpo_gec_solution_column"),
    ({"use_vllm": True}, "use_vllm=False"),
    ({"edge_grpo_gec_answer_template": "no placeholder"}, "edge_grpo_gec_answer_template"),
    ({"edge_grpo_gec_reflect_cue": "  "}, "edge_grpo_gec_reflect_cue"),
    ({"edge_grpo_gec_reflect_max_new_tokens": 0}, "edge_grpo_gec_reflect_max_new_tokens"),
])
def test_bad_values_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_fields_without_the_flag_are_refused():
    with pytest.raises(ValueError, match="only applies with edge_grpo_gec=True"):
        _config(edge_grpo_gec=False, edge_grpo_gec_answer_share=0.5)
