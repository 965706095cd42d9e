"""LSPO's pure parts: cliff detection, splice selection, the truncated behaviour log-probs, config errors."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.lspo import cliff_groups, lspo, splice_rows, truncated_behaviour_logps

nan = float("nan")


def test_cliff_groups_group_size_four():
    rewards = torch.tensor([0.0, 0, 0, 0,  # every rollout fails -> cliff
                            0, 1, 0, 0,  # one solved -> not a cliff
                            nan, 0, nan, 0.5,  # scored ones all below 1 (NaN unscored) -> cliff
                            nan, nan, nan, nan,  # nothing scored -> not a cliff (no evidence of failure)
                            1, 1, 1, 1])  # all solved
    assert cliff_groups(rewards, 4, 1.0).tolist() == [True, False, True, False, False]


def test_cliff_groups_group_size_two_and_threshold():
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.7, 0.7, nan])
    assert cliff_groups(rewards, 2, 1.0).tolist() == [True, True, True]
    # threshold 0.5: 0.7 >= 0.5 solves groups 1 and 2
    assert cliff_groups(rewards, 2, 0.5).tolist() == [True, False, False]


def test_cliff_groups_refuses_infinite_rewards():
    with pytest.raises(ValueError, match="inf"):
        cliff_groups(torch.tensor([0.0, math.inf]), 2, 1.0)


def test_splice_rows_caps_each_group_at_g_minus_one():
    # G = 4; group 1 (rows 4-7) all re-rolls succeed -> the first three slots; group 3 (rows 12-15): rows 13 and
    # 15 succeed, 12 fails, 14 unscored (NaN) -> rows 13 and 15.
    rows = torch.tensor([15, 14, 13, 12, 7, 6, 5, 4])  # any order: slots are taken in row order
    rewards = torch.tensor([1.0, nan, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert splice_rows(rows, rewards, 4, 1.0) == [4, 5, 6, 13, 15]


def test_splice_rows_group_size_two():
    # G = 2: at most one splice per group
    assert splice_rows(torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 1.0, 0.0, 2.0]), 2, 1.0) == [0, 3]


def test_truncated_behaviour_log_probs_by_hand():
    # pi_s = [0.5, 0.1, 0.9], pi_theta = [0.25, 0.3, 0.9]; C = 1:
    # b = max(log pi_s, log pi_theta) -> ratio pi_theta / pi_b = min(pi_theta / pi_s, 1) = [0.5, 1, 1]
    scaffold, current = torch.tensor([0.5, 0.1, 0.9]).log(), torch.tensor([0.25, 0.3, 0.9]).log()
    ratio = (current - truncated_behaviour_logps(scaffold, current, 1.0)).exp()
    torch.testing.assert_close(ratio, torch.tensor([0.5, 1.0, 1.0]))
    # C = 2: min(pi_theta / pi_s, 2) = min([0.5, 3, 1], 2) = [0.5, 2, 1]
    ratio = (current - truncated_behaviour_logps(scaffold, current, 2.0)).exp()
    torch.testing.assert_close(ratio, torch.tensor([0.5, 2.0, 1.0]))


def test_filter_keeps_every_rollout_and_refuses_inf():
    keep = lspo(RolloutBatch(torch.tensor([0.0, nan, 1.0, 0.0]), torch.tensor([3, 3, 3, 3]), 2))
    assert keep.tolist() == [True] * 4
    with pytest.raises(ValueError, match="inf"):
        lspo(RolloutBatch(torch.tensor([0.0, math.inf]), torch.tensor([3, 3]), 2))


@pytest.mark.parametrize(("flag", "value", "match"), [
    ("lspo_column", "", "lspo_column"),
    ("lspo_success_threshold", math.nan, "lspo_success_threshold"),
    ("lspo_lora_r", 0, "lspo_lora_r"),
    ("lspo_sft_steps", 0, "lspo_sft_steps"),
    ("lspo_sft_learning_rate", 0.0, "lspo_sft_learning_rate"),
    ("lspo_is_cap", -1.0, "lspo_is_cap"),
    ("lspo_lora_alpha", math.inf, "lspo_lora_alpha"),
    ("lspo_template", "no placeholder", "lspo_template"),
])
def test_config_errors_name_the_flag(tmp_path, flag, value, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, rollout_filter="lspo", **{flag: value})


def test_config_refuses_vllm(tmp_path):
    with pytest.raises(ValueError, match="use_vllm"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, rollout_filter="lspo", use_vllm=True)
