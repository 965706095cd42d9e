"""SPO's KL-adaptive forgetting factor (spo_single_rho_mode="kl"): ρ from D by hand, the tracker update with one ρ
per prompt, and the store helpers of the `prompt_kl` requirement."""

import math

import pytest
import torch

from trl_groupx.advantages.prompt_kl import (
    entry_from_row,
    last_scored_rows,
    masked_mean_abs_diff,
    pad_entries,
    prompt_kl_enabled,
)
from trl_groupx.advantages.spo_single import spo_rho_from_kl, spo_single_advantages
from trl_groupx.config import GRPOConfig
from trl_groupx.registry import get_variant

NAN = float("nan")


def kl(rewards, keys, prompt_kl, state, **kwargs):
    return spo_single_advantages(torch.tensor(rewards), kwargs.pop("g", 2), prompt_keys=torch.tensor(keys),
                                 prompt_kl=torch.tensor(prompt_kl, dtype=torch.float64), state=state,
                                 spo_single_rho_mode="kl", **kwargs)


@pytest.mark.parametrize("d, expected", [
    (0.0, 0.96),  # 2^0 = 1 → upper clip
    (NAN, 0.96),  # a prompt never seen: official D = 0 (its old log-probs are its current ones)
    (0.06, 0.875),  # 2^-1 = 0.5 → lower clip
    (0.03, 0.875),  # 2^-0.5 = 0.7071 → lower clip
    (0.005, 2 ** (-1 / 12)),  # 0.943874, inside the clip
    (0.01, 2 ** (-1 / 6)),  # 0.890899, inside the clip
])
def test_rho_from_kl_by_hand(d, expected):
    rho = spo_rho_from_kl(torch.tensor([d], dtype=torch.float64), 0.06, 0.875, 0.96)
    assert rho.item() == pytest.approx(expected, abs=1e-12)


def test_rho_without_clip_and_other_half_life():
    d = torch.tensor([0.0, 0.1, 0.2, 0.3], dtype=torch.float64)
    torch.testing.assert_close(spo_rho_from_kl(d, 0.1, 0.0, 1.0), torch.tensor([1.0, 0.5, 0.25, 0.125],
                                                                                 dtype=torch.float64))


def test_tracker_update_uses_each_prompts_rho():
    # prompts 3 and 7 in the tracker, prompt 9 new (prior 0.5/0.5); G = 2, one group per prompt
    state = {"keys": torch.tensor([3, 7]), "values": torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)}
    kl([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], [3, 3, 7, 7, 9, 9], [0.01, 0.01, 0.005, 0.005, NAN, NAN], state)
    r3, r7, r9 = 2 ** (-1 / 6), 2 ** (-1 / 12), 0.96  # D = 0.01, 0.005 (inside the clip), new → upper clip
    expected = torch.tensor([[r3 * 2 + 1, r3 * 1 + 1],  # s = 1 of n = 2
                             [r7 * 1 + 2, r7 * 3 + 0],  # s = 2
                             [r9 * 0.5 + 1, r9 * 0.5 + 1]], dtype=torch.float64)
    assert state["keys"].tolist() == [3, 7, 9]
    torch.testing.assert_close(state["values"], expected)


def test_advantages_do_not_depend_on_rho_only_the_update_does():
    a, b = {}, {}
    rewards, keys = [1.0, 0.0, 1.0, 1.0], [1, 1, 2, 2]
    adv_a = kl(rewards, keys, [0.0, 0.0, 0.0, 0.0], a)
    adv_b = kl(rewards, keys, [0.5, 0.5, 0.5, 0.5], b)
    torch.testing.assert_close(adv_a, adv_b)
    # prior 0.5/0.5, s = 1 and 2 of n = 2: ρ = 0.96 (D = 0) vs 0.875 (D = 0.5 → 2^-8.3 → lower clip)
    torch.testing.assert_close(a["values"][:, 0], torch.tensor([0.48 + 1, 0.48 + 2], dtype=torch.float64))
    torch.testing.assert_close(b["values"][:, 0], torch.tensor([0.4375 + 1, 0.4375 + 2], dtype=torch.float64))


def test_constant_mode_ignores_prompt_kl():
    a, b = {}, {}
    spo_single_advantages(torch.tensor([1.0, 0.0]), 2, prompt_keys=torch.tensor([5, 5]),
                          prompt_kl=torch.tensor([0.0, 0.0]), state=a)
    spo_single_advantages(torch.tensor([1.0, 0.0]), 2, prompt_keys=torch.tensor([5, 5]), state=b)
    torch.testing.assert_close(a["values"], torch.tensor([[0.875 * 0.5 + 1, 0.875 * 0.5 + 1]], dtype=torch.float64))
    assert torch.equal(a["values"], b["values"])


def test_first_group_init_uses_rho_min_and_nan_rewards_do_not_visit():
    state = {}
    # prompt 4: first group (1, 0) → N_init = 1/(1 − 0.875) = 8, α = 8·1.5/3 = 4, β = 4 (no decay on that visit);
    # prompt 6: both rewards NaN → not visited, not stored
    kl([1.0, 0.0, NAN, NAN], [4, 4, 6, 6], [NAN, NAN, NAN, NAN], state, spo_single_init="first_group")
    assert state["keys"].tolist() == [4]
    torch.testing.assert_close(state["values"], torch.tensor([[4.0, 4.0]], dtype=torch.float64))
    # second visit with D = 0.06 → ρ = 0.875: α = 0.875·4 + 2, β = 0.875·4
    kl([1.0, 1.0], [4, 4], [0.06, 0.06], state, spo_single_init="first_group")
    torch.testing.assert_close(state["values"], torch.tensor([[5.5, 3.5]], dtype=torch.float64))


def test_kl_mode_input_errors():
    with pytest.raises(ValueError, match="needs prompt_kl"):
        spo_single_advantages(torch.tensor([1.0, 0.0]), 2, prompt_keys=torch.tensor([5, 5]), state={},
                              spo_single_rho_mode="kl")
    with pytest.raises(ValueError, match="different prompt_kl"):
        kl([1.0, 0.0], [5, 5], [0.01, 0.02], {})
    with pytest.raises(ValueError, match="prompt_kl must have shape"):
        kl([1.0, 0.0], [5, 5], [0.01], {})


@pytest.mark.parametrize("flags, match", [
    ({"spo_single_rho_mode": "adaptive"}, "spo_single_rho_mode must be one of"),
    ({"spo_single_rho_min": 0.97}, "spo_single_rho_min and spo_single_rho_max"),
    ({"spo_single_rho_max": 1.5}, "spo_single_rho_min and spo_single_rho_max"),
    ({"spo_single_rho_min": -0.1}, "spo_single_rho_min and spo_single_rho_max"),
    ({"spo_single_kl_half_life": 0.0}, "spo_single_kl_half_life must be"),
    ({"spo_single_kl_half_life": float("inf")}, "spo_single_kl_half_life must be"),
    ({"spo_single_rho_mode": "kl", "spo_single_init": "first_group", "spo_single_rho_min": 1.0,
      "spo_single_rho_max": 1.0}, "spo_single_rho_min < 1"),
])
def test_config_validation(flags, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="spo_single", **flags)


def test_defaults_and_registered_flags():
    config = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="spo_single")
    variant = get_variant("spo_single")
    assert config.spo_single_rho_mode == "constant" and not prompt_kl_enabled(variant, config)
    paper = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **variant.flags)
    assert paper.spo_single_rho_mode == "kl" and prompt_kl_enabled(variant, paper)
    assert (paper.spo_single_kl_half_life, paper.spo_single_rho_min, paper.spo_single_rho_max) == (0.06, 0.875, 0.96)


def test_masked_mean_abs_diff_never_reads_padding():
    old = torch.tensor([[-1.0, -2.0, NAN], [-0.5, NAN, NAN], [NAN, NAN, NAN]])
    cur = torch.tensor([[-1.5, -1.0, 7.0], [-0.5, 3.0, NAN], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # row 0: (0.5 + 1.0)/2; row 1: 0/1; row 2: no token → 0
    torch.testing.assert_close(masked_mean_abs_diff(old, cur, mask), torch.tensor([0.75, 0.0, 0.0],
                                                                                  dtype=torch.float64))


def test_last_scored_rows():
    keys = torch.tensor([9, 9, 2, 2, 9, 5])
    unique, last = last_scored_rows(keys, torch.tensor([1.0, 0.0, 1.0, NAN, NAN, NAN]))
    assert unique.tolist() == [2, 5, 9] and last.tolist() == [2, -1, 1]


def test_entry_round_trip_through_padding():
    # left-padded prompt, right-padded completion with a masked tool token inside
    entry = entry_from_row(torch.tensor([0, 0, 11, 12]), torch.tensor([0, 0, 1, 1]), torch.tensor([21, 22, 23, 0]),
                           torch.tensor([1, 0, 1, 0]), torch.tensor([-0.1, -0.2, -0.3, -9.0]))
    assert entry["prompt_ids"].tolist() == [11, 12] and entry["completion_ids"].tolist() == [21, 22, 23]
    assert entry["completion_mask"].tolist() == [1, 0, 1]
    torch.testing.assert_close(entry["logps"], torch.tensor([-0.1, -0.2, -0.3]))
    other = entry_from_row(torch.tensor([13]), torch.tensor([1]), torch.tensor([24, 25]), torch.tensor([1, 1]),
                           torch.tensor([-1.0, -2.0]))
    batch = pad_entries([entry, other])
    assert batch["prompt_ids"].tolist() == [[11, 12], [0, 13]] and batch["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert batch["completion_ids"].tolist() == [[21, 22, 23], [24, 25, 0]]
    assert batch["completion_mask"].tolist() == [[1, 0, 1], [1, 1, 0]]
    assert math.isclose(batch["logps"][1, 1].item(), -2.0)
