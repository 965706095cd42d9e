"""RC-GRPO's pure parts: the per-group apportionment (G = 4, odd G, G = 2, expectation), the seeded assignment
(deterministic, split groups, step-dependent), the prompt placement, the keep-all filter, the RCTP data utility and
token helper, the tokenizer check, and the config-time refusals."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.rc_grpo import (
    HIGH_REWARD_TOKEN,
    LOW_REWARD_TOKEN,
    condition_prompt,
    condition_seed,
    group_condition_counts,
    group_conditions,
    rc_grpo,
    row_conditions,
)
from trl_groupx.sampling.rctp import add_condition_tokens, reward_conditioned_sft_rows
from trl_groupx.sampling.reward_tokens import condition_token_ids
from trl_groupx.toy import load_tiny_model, load_tiny_tokenizer

HALF = [0.5, 0.5]


def config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="rc_grpo", **flags)


# ---- apportionment inside one group -----------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.0, 0.3, 0.5, 0.999])
def test_group_of_four_at_half_is_always_two_and_two(offset):
    # points offset+i, i=0..3, below the edge 4*0.5 = 2: i = 0, 1 for every offset in [0, 1)
    assert group_condition_counts(HALF, 4, offset) == [2, 2]


def test_odd_group_gets_the_extra_rollout_by_the_offset():
    # G = 5, edge 2.5: offset + i < 2.5 for i = 0, 1, 2 iff offset < 0.5
    assert group_condition_counts(HALF, 5, 0.2) == [3, 2]
    assert group_condition_counts(HALF, 5, 0.49) == [3, 2]
    assert group_condition_counts(HALF, 5, 0.5) == [2, 3]
    assert group_condition_counts(HALF, 5, 0.9) == [2, 3]


def test_group_of_two_and_other_mixes():
    assert group_condition_counts(HALF, 2, 0.7) == [1, 1]
    assert group_condition_counts([0.25, 0.75], 4, 0.6) == [1, 3]  # edge 1: only offset + 0 < 1
    assert group_condition_counts([1 / 3] * 3, 3, 0.99) == [1, 1, 1]  # edges 1, 2, 3 (rounded, not 0.999..)
    assert group_condition_counts([1.0, 0.0], 4, 0.5) == [4, 0]
    assert group_condition_counts([0.0, 1.0], 4, 0.0) == [0, 4]
    with pytest.raises(ValueError, match="offset"):
        group_condition_counts(HALF, 4, 1.0)


def test_counts_are_floor_or_ceil_and_exact_in_expectation():
    mix = [0.3, 0.7]
    for g in (1, 2, 3, 5, 7):
        offsets = [(j + 0.5) / 1000 for j in range(1000)]  # uniform grid over [0, 1)
        counts = torch.tensor([group_condition_counts(mix, g, u) for u in offsets], dtype=torch.float64)
        assert (counts.sum(1) == g).all()
        for k, share in enumerate(mix):
            assert set(counts[:, k].tolist()) <= {math.floor(g * share), math.ceil(g * share)}
            assert counts[:, k].mean().item() == pytest.approx(g * share, abs=1e-9)


# ---- seeded assignment ----------------------------------------------------------------------------------------


def test_group_assignment_has_the_counts_and_is_deterministic():
    for g in (2, 3, 4, 5):
        for seed in range(20):
            order = group_conditions(HALF, g, seed)
            assert len(order) == g and sorted(set(order)) <= [0, 1]
            assert order.count(0) in (g // 2, -(-g // 2))
            assert order == group_conditions(HALF, g, seed)


def test_group_assignment_is_shuffled_across_positions():
    # over many groups each position of a G = 4 group gets token 0 about half the time, not always
    firsts = [group_conditions(HALF, 4, condition_seed(0, 0, 0, group))[0] for group in range(400)]
    assert 0.4 < firsts.count(0) / 400 < 0.6


def test_seed_is_a_fixed_hash_of_seed_step_and_group():
    assert condition_seed(0, 3, 0, 1) == condition_seed(0, 3, 0, 1)
    keys = {condition_seed(s, t, m, g) for s in (0, 1) for t in (0, 1) for m in (0, 1) for g in (0, 1)}
    assert len(keys) == 16
    # pinned so that a change of the hash or of the draw (which would change every run's tokens) is noticed
    assert [group_conditions(HALF, 4, condition_seed(42, 7, 0, g)) for g in range(3)] == PINNED


PINNED = [[1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 1, 1]]  # seed 42, step 7, groups 0..2


@pytest.mark.parametrize("group_size,split", [(4, 2), (4, 3), (5, 2), (2, 1), (3, 4)])
def test_split_groups_get_the_same_rows_as_one_process(group_size, split):
    """Rows [0, n) drawn at once equal the concatenation of the slices each process draws, whatever the split."""
    n = group_size * 4
    whole = row_conditions(HALF, group_size, 0, n, seed=5, step=2)
    parts = []
    for start in range(0, n, split):
        parts += row_conditions(HALF, group_size, start, min(split, n - start), seed=5, step=2)
    assert parts == whole
    for g in range(4):
        group = whole[g * group_size:(g + 1) * group_size]
        assert group.count(0) in (group_size // 2, -(-group_size // 2))


def test_steps_and_seeds_change_the_assignment():
    base = row_conditions(HALF, 4, 0, 64, seed=0, step=0)
    assert row_conditions(HALF, 4, 0, 64, seed=0, step=0) == base
    assert row_conditions(HALF, 4, 0, 64, seed=0, step=1) != base
    assert row_conditions(HALF, 4, 0, 64, seed=1, step=0) != base
    assert row_conditions(HALF, 4, 0, 64, seed=0, step=0, micro_step=1) != base


# ---- prompt placement and the filter ----------------------------------------------------------------------------


def test_token_goes_at_the_end_of_the_prompt_or_of_the_last_user_message():
    assert condition_prompt("2+2=", HIGH_REWARD_TOKEN) == "2+2=<|high_reward|>"
    chat = [{"role": "system", "content": "tools"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    out = condition_prompt(chat, LOW_REWARD_TOKEN)
    assert out[:3] == chat[:3] and out[3] == {"role": "user", "content": "c<|low_reward|>"}
    assert chat[3]["content"] == "c"  # the input is not modified
    blocks = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    assert condition_prompt(blocks, HIGH_REWARD_TOKEN)[0]["content"][-1] == {"type": "text", "text": HIGH_REWARD_TOKEN}
    with pytest.raises(ValueError, match="user message"):
        condition_prompt([{"role": "system", "content": "s"}], HIGH_REWARD_TOKEN)


def test_filter_keeps_every_rollout_and_refuses_inf():
    keep = rc_grpo(RolloutBatch(torch.tensor([1.0, float("nan"), 0.0, 0.0]), torch.ones(4), 2))
    assert keep.dtype == torch.bool and keep.all()
    with pytest.raises(ValueError, match="inf"):
        rc_grpo(RolloutBatch(torch.tensor([1.0, float("inf")]), torch.ones(2), 2))


# ---- RCTP data utility and tokens -------------------------------------------------------------------------------


def test_sft_rows_label_by_threshold():
    trajectories = [
        {"prompt": "p0", "completion": "c0", "reward": 1.0, "tools": ["t"]},  # = threshold -> high
        {"prompt": "p1", "completion": "c1", "reward": 0.99},  # below -> low
        {"prompt": [{"role": "user", "content": "p2"}], "completion": [{"role": "assistant", "content": "c2"}],
         "reward": 3},  # above, conversational
        {"prompt": "p3", "completion": "c3", "reward": -1.0},
    ]
    rows = reward_conditioned_sft_rows(trajectories, threshold=1.0)
    assert rows == [
        {"prompt": "p0<|high_reward|>", "completion": "c0", "tools": ["t"]},
        {"prompt": "p1<|low_reward|>", "completion": "c1"},
        {"prompt": [{"role": "user", "content": "p2<|high_reward|>"}],
         "completion": [{"role": "assistant", "content": "c2"}]},
        {"prompt": "p3<|low_reward|>", "completion": "c3"},
    ]
    assert trajectories[2]["prompt"][0]["content"] == "p2"  # inputs untouched
    custom = reward_conditioned_sft_rows([{"prompt": "p", "completion": "c", "score": 0.0}], threshold=0.0,
                                         tokens=("<good>", "<bad>"), reward_key="score")
    assert custom == [{"prompt": "p<good>", "completion": "c"}]


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), None, True])
def test_sft_rows_refuse_unscored_trajectories(reward):
    with pytest.raises(ValueError, match="trajectory 1 has reward"):
        reward_conditioned_sft_rows([{"prompt": "p", "completion": "c", "reward": 1.0},
                                     {"prompt": "p", "completion": "c", "reward": reward}], threshold=0.5)


def test_sft_rows_refuse_bad_arguments():
    with pytest.raises(ValueError, match="lacks \\['completion'\\]"):
        reward_conditioned_sft_rows([{"prompt": "p", "reward": 1.0}], threshold=0.5)
    with pytest.raises(ValueError, match="exactly two tokens"):
        reward_conditioned_sft_rows([], threshold=0.5, tokens=("<a>",))
    with pytest.raises(ValueError, match="threshold"):
        reward_conditioned_sft_rows([], threshold=float("nan"))


def test_add_condition_tokens_makes_single_ids_and_resizes_once():
    tokenizer, model = load_tiny_tokenizer(), load_tiny_model()
    assert len(tokenizer.encode(HIGH_REWARD_TOKEN, add_special_tokens=False)) == 15  # character level: 15 chars
    with pytest.raises(ValueError, match="rc_grpo_prompt_condition_tokens.*add_condition_tokens"):
        condition_token_ids(tokenizer, [HIGH_REWARD_TOKEN, LOW_REWARD_TOKEN])
    ids = add_condition_tokens(tokenizer, model)
    assert ids == [104, 105] and model.get_input_embeddings().num_embeddings == 106
    assert tokenizer.encode("1+1=" + HIGH_REWARD_TOKEN, add_special_tokens=False)[-1] == 104  # one id in context
    assert add_condition_tokens(tokenizer, model) == ids and len(tokenizer) == 106  # idempotent
    assert condition_token_ids(tokenizer, [HIGH_REWARD_TOKEN, LOW_REWARD_TOKEN]) == ids


# ---- config-time refusals -------------------------------------------------------------------------------------


def test_defaults_are_the_papers():
    c = config(**{"num_generations": 4})
    assert c.rc_grpo_prompt_condition_tokens == [HIGH_REWARD_TOKEN, LOW_REWARD_TOKEN]
    assert c.rc_grpo_condition_mix == [0.5, 0.5]


@pytest.mark.parametrize("flags,match", [
    ({"rc_grpo_prompt_condition_tokens": ["<|high_reward|>"]}, "rc_grpo_prompt_condition_tokens.*two distinct"),
    ({"rc_grpo_prompt_condition_tokens": ["<a>", "<a>"]}, "rc_grpo_prompt_condition_tokens.*two distinct"),
    ({"rc_grpo_prompt_condition_tokens": ["<a>", " "]}, "rc_grpo_prompt_condition_tokens.*non-empty"),
    ({"rc_grpo_condition_mix": [1.0]}, "rc_grpo_condition_mix.*one non-negative share per token"),
    ({"rc_grpo_condition_mix": [0.7, 0.7]}, "rc_grpo_condition_mix.*summing to 1"),
    ({"rc_grpo_condition_mix": [1.5, -0.5]}, "rc_grpo_condition_mix"),
    ({"rc_grpo_condition_mix": [float("nan"), 1.0]}, "rc_grpo_condition_mix"),
    ({"advantage_estimator": "spo_single"}, "advantage_estimator='spo_single'.*prompt_keys"),
    ({"use_vllm": True, "vllm_mode": "server"}, r"vllm_mode='server'.*Use vllm_mode='colocate'"),
])
def test_bad_flags_fail_at_construction(flags, match):
    with pytest.raises(ValueError, match=match):
        config(**flags)


def test_vllm_colocate_is_accepted():
    config(use_vllm=True, vllm_mode="colocate")  # one completion per row: each keeps its own condition token


def test_flags_without_the_variant_are_orphans():
    with pytest.raises(ValueError, match="rc_grpo_condition_mix.*rollout_filter='rc_grpo'"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, rc_grpo_condition_mix=[0.25, 0.75])
