"""RePO's pure parts: the bounded per-prompt buffer, highest_k / recent_k retrieval, split advantage normalisation and
the loss weights of the replayed rows, on hand-derived numbers; and its config refusals."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.repo import (
    buffered_entry,
    ranking_score,
    replay_block_advantages,
    replay_token_weights,
    repo,
    select_replay,
    split_advantages,
    update_buffer,
    weighted_rewards,
)


def _entries(n: int, start: int = 0):
    ids = [torch.tensor([start + i, 7]) for i in range(n)]
    logps = [torch.tensor([-0.1 * (start + i), -0.2]) for i in range(n)]
    return ids, logps


# ---- buffer ----------------------------------------------------------------------------------------------------


def test_buffer_keeps_at_most_max_cache_per_prompt_oldest_out():
    state: dict = {}
    ids, logps = _entries(3)
    update_buffer(state, [5, 5, 5], ids, logps, torch.tensor([[0.0], [1.0], [2.0]]), max_cache=4, max_prompts=None)
    ids, logps = _entries(3, start=3)
    update_buffer(state, [5, 5, 5], ids, logps, torch.tensor([[3.0], [4.0], [5.0]]), max_cache=4, max_prompts=None)
    entry = state["prompts"][5]
    # 6 pushed, 4 kept: entries 2, 3, 4, 5 (as deque(maxlen=4) after six appends)
    assert entry["rewards"].flatten().tolist() == [2.0, 3.0, 4.0, 5.0]
    assert entry["completion_ids"][:, 0].tolist() == [2, 3, 4, 5]
    assert torch.allclose(entry["logps"][0], torch.tensor([-0.2, -0.2]))
    assert entry["logps"].shape == entry["completion_ids"].shape == (4, 2) and entry["lengths"].tolist() == [2] * 4


def test_buffer_drops_least_recently_visited_prompt_beyond_max_prompts():
    state: dict = {}
    ids, logps = _entries(2)
    r = torch.zeros(2, 1)
    update_buffer(state, [1, 1], ids, logps, r, max_cache=8, max_prompts=2)
    update_buffer(state, [2, 2], ids, logps, r, max_cache=8, max_prompts=2)
    update_buffer(state, [1, 1], ids, logps, r, max_cache=8, max_prompts=2)  # 1 visited again: 2 is the oldest now
    update_buffer(state, [3, 3], ids, logps, r, max_cache=8, max_prompts=2)
    assert sorted(state["prompts"]) == [1, 3] and state["order"] == [1, 3]
    assert state["prompts"][1]["rewards"].shape == (4, 1)  # its two visits


def test_buffer_unbounded_prompts_with_none():
    state: dict = {}
    ids, logps = _entries(1)
    for key in range(50):
        update_buffer(state, [key], ids, logps, torch.zeros(1, 1), max_cache=1, max_prompts=None)
    assert len(state["prompts"]) == 50


def test_buffer_pads_entries_of_different_lengths_and_returns_them_unpadded():
    state: dict = {}
    update_buffer(state, [9, 9], [torch.tensor([4, 5, 6]), torch.tensor([], dtype=torch.long)],
                  [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([])],
                  torch.tensor([[1.0, float("nan")], [0.0, 0.0]]), max_cache=2, max_prompts=None)
    update_buffer(state, [9], [torch.tensor([7])], [torch.tensor([-0.5])], torch.tensor([[0.5, 0.5]]), max_cache=2,
                  max_prompts=None)
    entry = state["prompts"][9]
    # the 3-token entry was evicted: the width shrinks to the longest kept entry (1 token)
    assert entry["completion_ids"].dtype == torch.long and entry["logps"].dtype == torch.float32
    assert entry["completion_ids"].shape == (2, 1) and entry["lengths"].tolist() == [0, 1]
    ids, logps, rewards = buffered_entry(entry, 1)
    assert ids.tolist() == [7] and logps.tolist() == [-0.5] and rewards.tolist() == [0.5, 0.5]
    assert buffered_entry(entry, 0)[0].numel() == 0
    state2: dict = {}
    update_buffer(state2, [1], [torch.tensor([4, 5, 6])], [torch.tensor([-1.0, -2.0, -3.0])],
                  torch.tensor([[1.0, float("nan")]]), max_cache=2, max_prompts=None)
    assert buffered_entry(state2["prompts"][1], 0)[0].tolist() == [4, 5, 6]
    assert torch.isnan(state2["prompts"][1]["rewards"][0, 1])


# ---- retrieval -------------------------------------------------------------------------------------------------


def test_highest_k_takes_largest_reward_sums_ties_oldest_first():
    # sums per entry (two reward functions): [1, 2, 0, 2, 1.5, nan->0.5, all-nan -> -inf]
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [2.0, 0.0], [1.0, 0.5], [0.5, float("nan")],
                            [float("nan"), float("nan")]])
    assert ranking_score(rewards)[6] == float("-inf") and ranking_score(rewards)[5] == 0.5
    # descending: 1 (2.0, older), 3 (2.0), 4 (1.5), 0 (1.0), 5 (0.5), 2 (0.0), 6 (-inf)
    assert select_replay(rewards, k=3, min_cache=7, strategy="highest_k") == [1, 3, 4]
    assert select_replay(rewards, k=7, min_cache=7, strategy="highest_k") == [1, 3, 4, 0, 5, 2, 6]


def test_no_replay_below_min_cache():
    rewards = torch.ones(15, 1)
    assert select_replay(rewards, k=8, min_cache=16, strategy="highest_k") == []
    assert select_replay(torch.ones(16, 1), k=8, min_cache=16, strategy="highest_k") == list(range(8))
    assert select_replay(torch.zeros(0, 1), k=8, min_cache=0, strategy="highest_k") == []


def test_recent_k_takes_newest():
    assert select_replay(torch.zeros(6, 1), k=4, min_cache=4, strategy="recent_k") == [2, 3, 4, 5]


def test_unknown_strategy_raises():
    with pytest.raises(ValueError, match="repo_strategy"):
        select_replay(torch.zeros(4, 1), k=2, min_cache=2, strategy="random_k")


# ---- split advantages ------------------------------------------------------------------------------------------


def test_replay_block_hand_computed():
    # block [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; A = ±0.5 / (0.57735 + 1e-4)
    out = replay_block_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert torch.allclose(out, torch.tensor([a, -a, a, -a]), atol=1e-6)


def test_all_correct_replay_block_gets_zero():
    # highest_k on a prompt that has been solved before replays only correct answers: std 0, centred 0 -> A = 0
    out = replay_block_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 4)
    assert torch.equal(out[:4], torch.zeros(4))
    assert (out[4:] != 0).all()


def test_eps_enters_the_denominator():
    # block [1, 0]: std sqrt(0.5) = 0.70711; eps = 1 -> A = ±0.5 / 1.70711 = ±0.29289
    out = replay_block_advantages(torch.tensor([1.0, 0.0]), 2, eps=1.0)
    assert torch.allclose(out, torch.tensor([0.29289, -0.29289]), atol=1e-5)
    default = replay_block_advantages(torch.tensor([1.0, 0.0]), 2)
    assert torch.allclose(default, torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 1e-4), atol=1e-6)


def test_nan_rewards_excluded_and_zero():
    # [1, nan, 0, 0]: mean over {1, 0, 0} = 1/3, std = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = 0.57735
    out = replay_block_advantages(torch.tensor([1.0, float("nan"), 0.0, 0.0]), 4)
    s = math.sqrt(1 / 3) + 1e-4
    assert torch.allclose(out, torch.tensor([(2 / 3) / s, 0.0, -(1 / 3) / s, -(1 / 3) / s]), atol=1e-6)


def test_scale_rewards_none_centres_only_and_block_size_one_is_zero():
    out = replay_block_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, scale_rewards="none")
    assert torch.allclose(out, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert torch.equal(replay_block_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))
    assert replay_block_advantages(torch.zeros(0), 4).numel() == 0


def test_split_normalises_on_policy_and_replayed_blocks_separately():
    # one prompt, G = 4 on-policy [1, 0, 0, 0] then k = 2 replayed [1, 1] (all correct).
    # on: mean 0.25, std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5 -> [0.75, -0.25, -0.25, -0.25] / 0.5001
    # off: std 0 -> 0. A mixed normalisation over all 6 would give the replayed rows +0.5 / 0.5164 instead.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    is_replay = torch.tensor([False, False, False, False, True, True])
    out = split_advantages(rewards, is_replay, 4, 2)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0]) / torch.tensor([0.5001] * 4 + [1.0] * 2)
    assert torch.allclose(out, expected, atol=1e-6)


def test_weighted_rewards_nan_row():
    r = weighted_rewards(torch.tensor([[1.0, float("nan")], [float("nan"), float("nan")]]), torch.tensor([2.0, 1.0]))
    assert r[0] == 2.0 and torch.isnan(r[1])


# ---- loss weights ----------------------------------------------------------------------------------------------


def test_row_weights_shared_normaliser():
    w = replay_token_weights(torch.tensor([0.0, 1.0, 1.0]), torch.ones(3, 2), "sequence_mean", 0.5)
    assert w.shape == (3, 1) and w.flatten().tolist() == [1.0, 0.5, 0.5]


def test_row_weights_bnpo_separate_token_normalisers():
    # on-policy row with 3 tokens, replayed row with 1 token, c = 0.5: official
    #   L = (l00 + l01 + l02) / 3 + 0.5 * l10 / 1; weights under token_mean (n = 4): on 4/3, replayed 0.5 * 4 = 2
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    w = replay_token_weights(torch.tensor([0.0, 1.0]), mask, "token_mean", 0.5)
    assert torch.allclose(w.flatten(), torch.tensor([4 / 3, 2.0]))
    assert torch.isclose((loss * w * mask).sum() / mask.sum(), torch.tensor(6.0 / 3 + 0.5 * 4.0))
    only_on = replay_token_weights(torch.tensor([0.0, 0.0]), mask, "token_mean", 0.5)
    assert torch.allclose(only_on.flatten(), torch.ones(2))


# ---- the stage function and the config -------------------------------------------------------------------------


def test_filter_keeps_every_rollout_and_refuses_inf():
    keep = repo(RolloutBatch(torch.tensor([1.0, float("nan"), 0.0, 0.0]), torch.ones(4), 2), state={})
    assert keep.dtype == torch.bool and keep.all()
    with pytest.raises(ValueError, match="inf"):
        repo(RolloutBatch(torch.tensor([1.0, float("inf")]), torch.ones(2), 2), state={})


def _config(**kw):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="repo", num_generations=8,
                      **kw)


def test_defaults_are_the_official_setting():
    c = _config()
    assert (c.repo_strategy, c.repo_k, c.repo_min_cache, c.repo_max_cache, c.repo_off_coef, c.repo_adv_eps) == (
        "highest_k", 8, 16, 16, 1.0, 1e-4)
    assert c.repo_max_prompts is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"repo_strategy": "max_variance_k"}, "repo_strategy"),
        ({"repo_k": 0}, "repo_k=0"),
        ({"repo_k": 17}, "repo_k <= repo_min_cache"),
        ({"repo_min_cache": 32}, "repo_min_cache <= repo_max_cache"),
        ({"repo_max_cache": 0}, "repo_max_cache=0"),
        ({"repo_max_prompts": 0}, "repo_max_prompts=0"),
        ({"repo_off_coef": -1.0}, "repo_off_coef"),
        ({"repo_adv_eps": 0.0}, "repo_adv_eps"),
        ({"beta": 0.04}, "beta=0.0"),
        ({"loss_type": "luspo"}, "loss_type='luspo'"),
        ({"entropy_coef": 0.01}, "entropy_coef=0"),
    ],
)
def test_config_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_params_refused_without_the_variant():
    with pytest.raises(ValueError, match="repo_k"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, repo_k=4)
