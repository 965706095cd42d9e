"""GCPO reference injection: all-fail groups, the replaced slot, padding of the rewritten output, config checks."""

import pytest
import torch

import trl_groupx
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.gcpo_ref import gcpo_ref
from trl_groupx.sampling.reference_injection import (
    all_fail_groups,
    injection_rows,
    reference_completion_ids,
    replace_completions,
)

NAN = float("nan")
PAD = 0


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "gcpo_ref",
            "num_generations": 4, "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


# ---- which groups, which slot ------------------------------------------------------------------------------------


def test_all_fail_groups_hand_cases():
    # G = 4, threshold 1: [0,0,0,0] all fail -> inject; [1,0,0,0] mixed -> untouched; [1,1,1,1] solved -> untouched;
    # [0,.5,0,.2] all below 1 (partial rewards) -> inject; [NaN,0,NaN,0] scored all fail -> inject;
    # all NaN (no evidence) -> untouched
    r = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, .5, 0, .2, NAN, 0, NAN, 0, NAN, NAN, NAN, NAN])
    assert all_fail_groups(r, 4, 1.0).tolist() == [True, False, False, True, True, False]


def test_all_fail_groups_threshold_and_small_groups():
    # threshold 0.5: 0.5 counts as solved (>=), 0.49 does not
    assert all_fail_groups(torch.tensor([0.5, 0.0, 0.49, 0.0]), 2, 0.5).tolist() == [False, True]
    # G = 1: each rollout is its own group
    assert all_fail_groups(torch.tensor([0.0, 1.0, NAN]), 1, 1.0).tolist() == [True, False, False]
    # negative rewards (e.g. -1/+1 accuracy): threshold 1 -> [-1,-1] fails, [-1,1] mixed
    assert all_fail_groups(torch.tensor([-1.0, -1.0, -1.0, 1.0]), 2, 1.0).tolist() == [True, False]


def test_all_fail_groups_rejects_inf():
    with pytest.raises(ValueError, match="gcpo_ref.*inf"):
        all_fail_groups(torch.tensor([0.0, float("inf")]), 2, 1.0)
    with pytest.raises(ValueError, match="gcpo_ref.*inf"):
        gcpo_ref(RolloutBatch(torch.tensor([0.0, -float("inf")]), None, 2))


def test_injection_rows_are_the_last_slot_of_each_group():
    # groups 0 and 3 of G = 4 -> global rows 3 and 15; G = 1 -> the row itself; G = 2 -> rows 1, 5
    assert injection_rows(torch.tensor([True, False, False, True]), 4).tolist() == [3, 15]
    assert injection_rows(torch.tensor([True, False, True]), 1).tolist() == [0, 2]
    assert injection_rows(torch.tensor([True, False, True]), 2).tolist() == [1, 5]
    assert injection_rows(torch.tensor([False, False]), 4).tolist() == []


def test_filter_keeps_everything():
    keep = gcpo_ref(RolloutBatch(torch.tensor([0.0, NAN, 1.0, 0.0]), None, 2))
    assert keep.dtype == torch.bool and keep.tolist() == [True] * 4


def test_injected_reference_gets_the_positive_advantage():
    # G = 4, 0/1 rewards, group [0,0,0,0] -> [0,0,0,1] after injection (reference scored 1):
    # mean 1/4, unbiased std sqrt(((3 * 1/16) + 9/16) / 3) = 1/2; A_ref = (3/4) / (1/2 + 1e-4), others -(1/4)/(...)
    a = group_normalized_advantages(torch.tensor([0.0, 0.0, 0.0, 1.0]), 4, scale_rewards="group")
    torch.testing.assert_close(a, torch.tensor([-0.25, -0.25, -0.25, 0.75]) / (0.5 + 1e-4))
    # G = 2: [0, 1] -> std sqrt(1/2); A_ref = 0.5 / (0.7071 + 1e-4) > 0
    a2 = group_normalized_advantages(torch.tensor([0.0, 1.0]), 2, scale_rewards="group")
    torch.testing.assert_close(a2, torch.tensor([-0.5, 0.5]) / (2 ** -0.5 + 1e-4))
    # G = 1: a group of one has no contrast: the reference replaces the only rollout and gets advantage 0
    assert group_normalized_advantages(torch.tensor([1.0]), 1, scale_rewards="group").tolist() == [0.0]


# ---- tokenizing the reference ------------------------------------------------------------------------------------


def test_reference_completion_ids_appends_eos_and_truncates(tokenizer):
    ids = tokenizer("25", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    assert reference_completion_ids("25", tokenizer, eos, 50) == ids + [eos]
    assert reference_completion_ids("25", tokenizer, eos, len(ids)) == ids  # cut: no room left for EOS
    assert reference_completion_ids("", tokenizer, eos, 5) == [eos]


# ---- rewriting the output ----------------------------------------------------------------------------------------


def _output(widths, T=4, P=3, with_logps=True, tool_mask=False, sequence_is=False):
    """Synthetic TRL output: row i has `widths[i]` completion tokens 10*(i+1)+t, right padding with PAD."""
    B = len(widths)
    ids = torch.full((B, T), PAD)
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, w in enumerate(widths):
        ids[i, :w] = torch.arange(w) + 10 * (i + 1)
        mask[i, :w] = 1
    out = {
        "prompt_ids": torch.arange(B * P).view(B, P) + 100,
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": mask,
        "advantages": torch.zeros(B),
        "num_items_in_batch": mask.sum(),
    }
    if with_logps:
        out["old_per_token_logps"] = -torch.rand(B, T) * mask
        out["ref_per_token_logps"] = -torch.rand(B, T) * mask
        out["sampling_per_token_logps"] = -torch.rand(B, T) * mask
        out["importance_sampling_ratio"] = torch.full((B, 1), 0.5) if sequence_is else torch.full((B, T), 0.5)
    if tool_mask:
        out["tool_mask"] = mask.clone()
    return out


def test_replace_longer_reference_widens_every_completion_tensor():
    out = _output([2, 4, 1, 3])
    ref = [7, 8, 9, 6, 2]  # 5 tokens > T = 4
    new = replace_completions(out, [1], [ref], PAD)
    assert new["completion_ids"].shape == (4, 5)
    assert new["completion_ids"][1].tolist() == ref and new["completion_mask"][1].tolist() == [1] * 5
    # other rows: unchanged tokens, padded with PAD / mask 0 / logps 0 / ratio 0 in the new column
    for i in (0, 2, 3):
        assert new["completion_ids"][i, :4].tolist() == out["completion_ids"][i].tolist()
        assert new["completion_ids"][i, 4] == PAD and new["completion_mask"][i, 4] == 0
        for key in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
            torch.testing.assert_close(new[key][i, :4], out[key][i])
            assert new[key][i, 4] == 0.0
        assert new["importance_sampling_ratio"][i, :4].tolist() == [0.5] * 4
    # injected row: logps are placeholders (0) for the caller to fill, vLLM ratio 1
    assert new["old_per_token_logps"][1].tolist() == [0.0] * 5
    assert new["importance_sampling_ratio"][1].tolist() == [1.0] * 5
    # prompt side untouched
    assert torch.equal(new["prompt_ids"], out["prompt_ids"]) and torch.equal(new["prompt_mask"], out["prompt_mask"])


def test_replace_shorter_reference_clears_the_old_tokens_and_keeps_the_width():
    out = _output([2, 4, 1, 3], tool_mask=True)
    before = {k: v.clone() for k, v in out.items() if torch.is_tensor(v)}
    new = replace_completions(out, [1, 3], [[7], [5, 6]], PAD)
    assert new["completion_ids"].shape == (4, 4)
    assert new["completion_ids"][1].tolist() == [7, PAD, PAD, PAD]
    assert new["completion_mask"][1].tolist() == [1, 0, 0, 0]
    assert new["completion_ids"][3].tolist() == [5, 6, PAD, PAD]
    assert new["completion_mask"][3].tolist() == [1, 1, 0, 0]
    assert new["tool_mask"][1].tolist() == [1, 1, 1, 1]  # tool mask is 1 everywhere on a plain completion
    for i in (0, 2):  # untouched rows
        assert new["completion_ids"][i].tolist() == before["completion_ids"][i].tolist()
        assert new["tool_mask"][i].tolist() == before["tool_mask"][i].tolist()
    # the caller's dict is not modified (masks and ids are rewritten on copies)
    for key, value in before.items():
        assert torch.equal(out[key], value), key


def test_replace_with_sequence_level_ratio_keeps_its_single_column():
    out = _output([2, 4], sequence_is=True)
    new = replace_completions(out, [0], [[1, 2, 3, 4, 5, 6]], PAD, sequence_level_is=True)
    assert new["completion_ids"].shape == (2, 6)
    assert new["importance_sampling_ratio"].tolist() == [[1.0], [0.5]]
    assert out["importance_sampling_ratio"].tolist() == [[0.5], [0.5]]


def test_replace_nothing_returns_the_same_tensors():
    out = _output([2, 3])
    new = replace_completions(out, [], [], PAD)
    assert all(new[k] is out[k] for k in out)


def test_replace_refuses_multimodal_outputs():
    out = _output([2, 3])
    out["pixel_values"] = torch.zeros(2, 3)
    with pytest.raises(NotImplementedError, match="gcpo_ref.*pixel_values"):
        replace_completions(out, [0], [[1]], PAD)


# ---- config ------------------------------------------------------------------------------------------------------


def test_config_defaults_and_flags():
    variant = trl_groupx.get_variant("gcpo_ref")
    assert variant.stage == "sampling"
    assert variant.params == ("gcpo_ref_column", "gcpo_ref_success_threshold", "gcpo_ref_template")
    config = _config()
    assert config.active_variants() == {"sampling": "gcpo_ref"}
    assert (config.gcpo_ref_column, config.gcpo_ref_success_threshold, config.gcpo_ref_template) == (
        "solution", 1.0, "{ref}")
    assert trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **variant.flags)


@pytest.mark.parametrize("flag, value, match", [
    ("gcpo_ref_column", "", "gcpo_ref_column=''.*column"),
    ("gcpo_ref_success_threshold", float("nan"), "gcpo_ref_success_threshold=nan.*finite"),
    ("gcpo_ref_success_threshold", float("inf"), "gcpo_ref_success_threshold=inf.*finite"),
    ("gcpo_ref_template", "The answer is {}.", "gcpo_ref_template=.*must contain '{ref}'"),
])
def test_bad_flags_fail_at_construction(flag, value, match):
    with pytest.raises(ValueError, match=match):
        _config(**{flag: value})


def test_params_need_the_variant():
    with pytest.raises(ValueError, match="gcpo_ref_column='answer' belongs to variant 'gcpo_ref'"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, gcpo_ref_column="answer")


class _Accelerator:
    """Two processes seen from one: `gather` adds the other process's flag."""

    num_processes, device = 2, "cpu"

    def __init__(self, other_failed: bool):
        self.other_failed = other_failed

    def gather(self, flag):
        return torch.cat([flag, torch.tensor([self.other_failed])])


def test_a_missing_reference_stops_every_process():
    from trl_groupx.sampling.reference_injection import raise_together

    raise_together(None, _Accelerator(False), "solution")  # nobody failed: no error
    with pytest.raises(ValueError, match="another process found a prompt .* gcpo_ref_column='solution'"):
        raise_together(None, _Accelerator(True), "solution")  # this process is fine, the other is not: stop too
    own = ValueError("this row has no reference")
    with pytest.raises(ValueError, match="this row has no reference"):
        raise_together(own, _Accelerator(False), "solution")
