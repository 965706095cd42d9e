"""consistency_grpo's pure parts: which variant each global row answers (G = 4 with 4 variants, fewer cycle, more
are refused, groups of 1 and 2), groups split across processes from global indices, text and chat prompts, the
rewritten rows' columns, malformed cells, the keep-all filter, the toy paraphrases and the config-time refusals."""

import copy

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.consistency_grpo import (
    PARAPHRASE_ID_COLUMN,
    VARIANT_INDEX_COLUMN,
    assign_paraphrases,
    check_row_variants,
    consistency_grpo,
    variant_index,
    variant_positions,
)
from trl_groupx.toy.paraphrases import arithmetic_paraphrases

TEXT = ["2+3=", "3+2=", "What is 2+3?", "2 + 3 ="]
CHAT = [[{"role": "user", "content": t}] for t in TEXT]


def config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="consistency_grpo", **flags)


def repeated(rows, group_size):
    """TRL's layout: each dataset row repeated G times, consecutively."""
    return [copy.deepcopy(r) for r in rows for _ in range(group_size)]


# ---- positions and variant indices --------------------------------------------------------------------------------


def test_positions_of_one_process_holding_whole_groups():
    # rows 0..7, G = 4: row r is rollout r mod 4 of group r // 4
    assert variant_positions(0, 8, 4) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]


def test_positions_of_groups_split_across_processes():
    # 2 processes x 2 rows, G = 4: rank 1 holds global rows 2, 3 = rollouts 2, 3 of group 0
    assert variant_positions(0, 2, 4) == [(0, 0), (0, 1)]
    assert variant_positions(1 * 2, 2, 4) == [(0, 2), (0, 3)]
    # 2 processes x 3 rows, G = 2: the middle group (rows 2, 3) straddles the processes
    assert variant_positions(0, 3, 2) == [(0, 0), (0, 1), (1, 0)]
    assert variant_positions(1 * 3, 3, 2) == [(1, 1), (2, 0), (2, 1)]


def test_four_variants_for_four_rollouts_one_each():
    assert [variant_index(j, 4, 4) for j in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize("num_variants,want", [(1, [0, 0, 0, 0]), (2, [0, 1, 0, 1]), (3, [0, 1, 2, 0])])
def test_fewer_variants_cycle(num_variants, want):
    # j mod V: V = 2 gives each variant two rollouts; V = 3 gives variant 0 the extra one
    assert [variant_index(j, num_variants, 4) for j in range(4)] == want


def test_more_variants_than_rollouts_and_no_variants_are_refused():
    with pytest.raises(ValueError, match=r"5 prompt variants in its consistency_grpo_column column but "
                                         r"num_generations=4.*variants 4..4 would never.*num_generations >= 5"):
        variant_index(0, 5, 4)
    with pytest.raises(ValueError, match="at least one prompt variant in its consistency_grpo_column"):
        variant_index(0, 0, 4)


def test_groups_of_one_and_two():
    assert [variant_index(j, 1, 1) for j in range(1)] == [0]  # G = 1: the single rollout answers the only variant
    assert [variant_index(j, 2, 2) for j in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="num_generations=1"):
        variant_index(0, 2, 1)


# ---- the rewritten rows -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variants,prompt", [(TEXT, "2+3="), (CHAT, CHAT[0])], ids=["text", "chat"])
def test_each_group_gets_its_rows_variants_in_order(variants, prompt):
    other = [v.replace("2", "7") if isinstance(v, str) else [{**v[0], "content": v[0]["content"].replace("2", "7")}]
             for v in variants]
    rows = repeated([{"prompt": prompt, "paraphrases": variants, "answer": "5"},
                     {"prompt": other[0], "paraphrases": other, "answer": "10"}], 4)
    before = copy.deepcopy(rows)
    out = assign_paraphrases(rows, 0, 4)
    assert [r["prompt"] for r in out] == variants + other
    assert [r[PARAPHRASE_ID_COLUMN] for r in out] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r[VARIANT_INDEX_COLUMN] for r in out] == [0, 1, 2, 3] * 2
    assert [r["answer"] for r in out] == ["5"] * 4 + ["10"] * 4  # other columns kept
    assert rows == before  # inputs untouched
    if not isinstance(prompt, str):  # context reset: a fresh copy per rollout, not the cell's own list
        out[0]["prompt"][0]["content"] = "changed"
        assert rows[0]["paraphrases"][0][0]["content"] == "2+3=" and out[4]["prompt"][0]["content"] != "changed"


def test_fewer_variants_cycle_in_the_rows():
    rows = repeated([{"prompt": "2+3=", "paraphrases": TEXT[:2]}], 4)
    out = assign_paraphrases(rows, 0, 4)
    assert [r["prompt"] for r in out] == ["2+3=", "3+2=", "2+3=", "3+2="]
    assert [r[VARIANT_INDEX_COLUMN] for r in out] == [0, 1, 0, 1]


def test_split_groups_agree_with_one_process():
    """Two processes assigning their slices from global indices give exactly the single-process rows."""
    rows = repeated([{"prompt": "2+3=", "paraphrases": TEXT}, {"prompt": "7+3=", "paraphrases": ["7+3=", "3+7="]}], 4)
    whole = assign_paraphrases(rows, 0, 4)
    for local_n in (2, 4):  # 4 processes x 2 rows (groups split in halves), 2 x 4 (whole groups)
        pieces = [assign_paraphrases(rows[s:s + local_n], s, 4) for s in range(0, 8, local_n)]
        assert [r for p in pieces for r in p] == whole
    assert [r["prompt"] for r in whole] == TEXT + ["7+3=", "3+7=", "7+3=", "3+7="]
    # a slice that starts mid-group: rollouts 2, 3 of group 0 and 0, 1 of group 1, with their global group ids
    assert [(r["prompt"], r[PARAPHRASE_ID_COLUMN]) for r in assign_paraphrases(rows[2:6], 2, 4)] == [
        ("What is 2+3?", 0), ("2 + 3 =", 0), ("7+3=", 1), ("3+7=", 1)]


def test_an_existing_paraphrase_id_is_replaced_by_the_group():
    rows = repeated([{"prompt": "2+3=", "paraphrases": TEXT, PARAPHRASE_ID_COLUMN: "q17"}], 4)
    assert {r[PARAPHRASE_ID_COLUMN] for r in assign_paraphrases(rows, 8, 4)} == {2}  # rows 8..11: group 2


def test_another_column_name():
    rows = repeated([{"prompt": "2+3=", "variants": TEXT}], 4)
    assert [r["prompt"] for r in assign_paraphrases(rows, 0, 4, column="variants")] == TEXT
    with pytest.raises(ValueError, match=r"row 0 has no 'paraphrases' column.*consistency_grpo_column"):
        assign_paraphrases(rows, 0, 4)


@pytest.mark.parametrize("cell,prompt,match", [
    (None, "2+3=", r"'paraphrases' = None"),
    ("2+3=", "2+3=", r"'paraphrases' = '2\+3='"),
    ([], "2+3=", r"'paraphrases' = \[\]"),
    (["2+3=", ""], "2+3=", "text prompt, so every variant must be a non-empty string"),
    (CHAT, "2+3=", "text prompt, so every variant must be a non-empty string"),
    (TEXT, CHAT[0], "conversational prompt, so every variant must be a non-empty list"),
    ([[{"role": "user"}]], CHAT[0], "conversational prompt"),
    ([[]], CHAT[0], "conversational prompt"),
])
def test_malformed_cells_name_the_flag_and_the_fix(cell, prompt, match):
    with pytest.raises(ValueError, match=match) as err:
        check_row_variants(cell, prompt, "paraphrases", 3)
    assert "row 3" in str(err.value) and "consistency_grpo_column" in str(err.value)


def test_more_variants_than_rollouts_in_a_row_is_refused():
    rows = repeated([{"prompt": "2+3=", "paraphrases": TEXT + ["two plus three="]}], 4)
    with pytest.raises(ValueError, match="5 prompt variants.*num_generations=4"):
        assign_paraphrases(rows, 0, 4)


# ---- the filter and the flags -------------------------------------------------------------------------------------


def test_filter_keeps_every_rollout_and_refuses_inf():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 0.5])
    keep = consistency_grpo(RolloutBatch(rewards, torch.ones(4), 4))
    assert keep.dtype == torch.bool and keep.tolist() == [True] * 4
    with pytest.raises(ValueError, match="±inf rewards"):
        consistency_grpo(RolloutBatch(torch.tensor([1.0, float("inf"), 0.0, 0.0]), torch.ones(4), 4))


def test_config_defaults_and_refusals():
    assert config().consistency_grpo_column == "paraphrases"
    for bad in ("", " ", "prompt", "paraphrase_id", 3):
        with pytest.raises(ValueError, match=r"consistency_grpo_column=.*must name the dataset column"):
            config(consistency_grpo_column=bad)
    with pytest.raises(ValueError, match=r"vllm_mode='server'.*Use vllm_mode='colocate'"):
        config(use_vllm=True, vllm_mode="server")
    config(use_vllm=True, vllm_mode="colocate")  # one completion per row: fine
    with pytest.raises(ValueError, match=r"advantage_estimator='spo_single' keeps per-prompt state"):
        config(advantage_estimator="spo_single")
    config(advantage_estimator="rloo")


def test_toy_paraphrases():
    assert arithmetic_paraphrases("2+3=") == ["2+3=", "3+2=", "What is 2+3?", "2 + 3 ="]
    assert arithmetic_paraphrases("12-7=") == ["12-7=", "(12)-(7)=", "What is 12-7?", "12 - 7 ="]
    with pytest.raises(ValueError, match="not a toy arithmetic problem"):
        arithmetic_paraphrases("What is 2+3?")
