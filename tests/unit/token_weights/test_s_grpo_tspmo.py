"""S-GRPO / T-SPMO token credit: hand-derived prefix-trie numbers, a brute-force trie, edge cases, token subsets.

Token ids: a=1, b=2, c=3, d=4, e=5, f=6, g=7, h=8, i=9. Credit of token t of completion i:
V(node after t) − V(node before t), V = mean incoming advantage of the valid completions through the node, the
root (empty prefix) being the mean over the group's valid completions.
"""

import random

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import s_grpo_tspmo, s_grpo_tspmo_token_advantages
from trl_groupx.token_weights.nat import nat_generator, sample_keep

a, b, c, d, e, f, g, h, i = range(1, 10)


def run(adv, ids, mask=None, rewards=None, group_size=None, credit="prefix", q=1.0, seed=0, step=0):
    ids = torch.tensor(ids)
    mask = torch.ones_like(ids) if mask is None else torch.tensor(mask)
    adv = torch.tensor(adv, dtype=torch.float32)
    rewards = None if rewards is None else torch.tensor(rewards, dtype=torch.float32)
    ctx = TokenContext(mask, group_size or ids.shape[0], completion_ids=ids, rewards=rewards)
    return s_grpo_tspmo_token_advantages(adv, ctx, s_grpo_tspmo_credit=credit, s_grpo_tspmo_keep_prob=q, seed=seed,
                                         global_step=step)


def test_catalog_example_shared_prefix_zero_divergent_plus_minus():
    # 'a b c' (r=1), 'a b d' (r=0), scale_rewards="none": v = r − 0.5 = ±0.5. Root mean 0; a, b: node {1, 2},
    # mean 0 − 0 = 0; c: {1} → 0.5 − 0 = +0.5; d: {2} → −0.5.
    out = run([0.5, -0.5], [[a, b, c], [a, b, d]], rewards=[1.0, 0.0])
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, -0.5]]))


def test_three_way_branch():
    # 'a b', 'a c', 'a d', r = [1, 0, 0.2], v = r − 0.4 = [0.6, −0.4, −0.2]: a shared (0); b/c/d get v − 0.
    out = run([0.6, -0.4, -0.2], [[a, b], [a, c], [a, d]])
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.6], [0.0, -0.4], [0.0, -0.2]]))
    # raw rewards as values: the group-mean shift cancels in the difference of means
    torch.testing.assert_close(run([1.0, 0.0, 0.2], [[a, b], [a, c], [a, d]]), out)


def test_nested_branches_by_hand_and_telescoping():
    # 'a b c' .5, 'a b d' −.5, 'a e f' −.5, 'g h i' .5. Root mean 0.
    # t0: a → node {1,2,3} mean −1/6 → −1/6; g → {4} .5 → +.5
    # t1: b → {1,2} mean 0, parent −1/6 → +1/6; e → {3} −.5 − (−1/6) = −1/3; h → 0
    # t2: c → .5 − 0 = .5; d → −.5; f → 0; i → 0
    v = [0.5, -0.5, -0.5, 0.5]
    out = run(v, [[a, b, c], [a, b, d], [a, e, f], [g, h, i]])
    s = 1 / 6
    expected = torch.tensor([[-s, s, 0.5], [-s, s, -0.5], [-s, -2 * s, 0.0], [0.5, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.sum(-1), torch.tensor(v))  # Σ_t = v_i − mean(v) = v_i


def test_identical_completions_get_zero_whatever_their_rewards():
    out = run([0.5, -0.5, 0.5], [[a, b, c]] * 3, rewards=[1.0, 0.0, 1.0])
    assert torch.equal(out, torch.zeros(3, 3))


def test_group_size_one_is_zero_and_groups_are_independent():
    assert torch.equal(run([0.7], [[a, b]]), torch.zeros(1, 2))
    # two groups of two: a token id shared across groups is no shared prefix
    out = run([0.5, -0.5, 1.0, -1.0], [[a, b], [a, c], [a, b], [a, b]], group_size=2)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.5], [0.0, -0.5], [0.0, 0.0], [0.0, 0.0]]))


def test_group_size_two_first_token_divergence():
    # r = [1, 0], v = ±0.5: divergence at t0 (credit ±0.5), each later token is alone on its branch (0)
    out = run([0.5, -0.5], [[a, b, c], [d, b, c]])
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]]))


def test_padding_never_read_and_early_stop():
    # 'a b' then padding whose ids copy the other completion ('a b c d', truncated at T=4). Were padding read, the
    # two would share every node (all 0). Node after b = {1, 2}, mean 0; c → {2}: −0.5 − 0; d alone: 0.
    out = run([0.5, -0.5], [[a, b, c, d], [a, b, c, d]], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -0.5, 0.0]]))
    # with an explicit end token (EOS = 9) the early stop is a branch of its own: +0.5
    out = run([0.5, -0.5], [[a, b, i, d], [a, b, c, d]], mask=[[1, 1, 1, 0], [1, 1, 1, 1]])
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.5, 0.0], [0.0, 0.0, -0.5, 0.0]]))


def test_empty_completion_counts_at_the_root_only():
    # 'a b' v=1, empty v=0 (mask all 0), 'a c' v=−1: root mean 0; a → {1,3} mean 0 → 0; b → 1; c → −1
    out = run([1.0, 0.0, -1.0], [[a, b], [a, b], [a, c]], mask=[[1, 1], [0, 0], [1, 1]])
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, -1.0]]))
    # the empty completion shifts the root: values [1, 3, −1] → root mean 1, a → {1,3} mean 0 → −1
    out = run([1.0, 3.0, -1.0], [[a, b], [a, b], [a, c]], mask=[[1, 1], [0, 0], [1, 1]])
    torch.testing.assert_close(out, torch.tensor([[-1.0, 1.0], [0.0, 0.0], [-1.0, -1.0]]))


def test_nan_rewards_excluded_from_means_and_get_zero():
    # values [1, NaN, 0] (raw rewards): valid root mean 0.5; c → 1 − 0.5; e → 0 − 0.5. Counting NaN as 0 would
    # give a root mean of 1/3.
    ids = [[a, b, c], [a, b, d], [a, b, e]]
    out = run([1.0, float("nan"), 0.0], ids, rewards=[1.0, float("nan"), 0.0])
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0], [0.0, 0.0, -0.5]]))
    # a finite incoming advantage on an unscored rollout is excluded all the same
    torch.testing.assert_close(run([1.0, 0.7, 0.0], ids, rewards=[1.0, float("nan"), 0.0]), out)
    # all unscored: zeros
    assert torch.equal(run([0.0, 0.0, 0.0], ids, rewards=[float("nan")] * 3), torch.zeros(3, 3))


def test_inf_reward_is_an_error():
    with pytest.raises(ValueError, match="inf"):
        run([0.5, -0.5], [[a, b], [a, c]], rewards=[float("inf"), 0.0])


def brute_force(values, ids, mask, group_size):
    """Dict-based prefix trie, one group at a time, in Python."""
    out = torch.zeros(len(ids), len(ids[0]), dtype=torch.float64)
    for start in range(0, len(ids), group_size):
        rows = range(start, start + group_size)
        paths = {r: tuple(ids[r][t] for t in range(len(ids[r])) if mask[r][t]) for r in rows}
        node = {}
        for r in rows:
            for k in range(len(paths[r]) + 1):
                node.setdefault(paths[r][:k], []).append(values[r])
        mean = {p: sum(vs) / len(vs) for p, vs in node.items()}
        for r in rows:
            for t in range(len(paths[r])):
                out[r, t] = mean[paths[r][: t + 1]] - mean[paths[r][:t]]
    return out


@pytest.mark.parametrize("chunk", [None, 1])
def test_matches_brute_force_trie_over_many_groups(monkeypatch, chunk):
    if chunk is not None:  # one group per chunk
        monkeypatch.setattr(s_grpo_tspmo, "_MAX_CHUNK_ELEMENTS", chunk)
    rng = random.Random(0)
    group_size, n, t = 5, 30, 7
    ids = [[rng.choice([1, 2, 3]) for _ in range(t)] for _ in range(n)]
    lengths = [rng.randint(0, t) for _ in range(n)]
    mask = [[int(s < length) for s in range(t)] for length in lengths]
    values = [rng.choice([0.0, 1.0, 0.5]) for _ in range(n)]
    out = run(values, ids, mask=mask, group_size=group_size)
    expected = brute_force(values, ids, mask, group_size).float()
    torch.testing.assert_close(out, expected)
    assert (out != 0).any() and (out[torch.tensor(mask) == 0] == 0).all()


def test_sequence_credit_with_all_tokens_is_grpo():
    mask = [[1, 1, 1], [1, 1, 0]]
    out = run([0.5, -0.5], [[a, b, c], [a, b, d]], mask=mask, credit="sequence")
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]]))


@pytest.mark.parametrize("credit", ["prefix", "sequence"])
def test_token_subset_keeps_nat_draw_weighted_by_one_over_q(credit):
    ids = [[a, b, c, d], [a, b, d, c], [a, e, c, d], [g, b, c, d]]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    v = [1.0, -1.0, 0.5, -0.5]
    full = run(v, ids, mask=mask.tolist(), credit=credit)
    out = run(v, ids, mask=mask.tolist(), credit=credit, q=0.5, seed=3, step=7)
    keep = sample_keep(mask, "urs", 0.5, 0.0, nat_generator(3, 7))
    torch.testing.assert_close(out, torch.where(keep, full / 0.5, torch.zeros_like(full)))
    assert keep.any() and keep.sum() < mask.sum()  # this draw drops some real tokens and keeps some


@pytest.mark.parametrize(
    "flags,match",
    [
        (dict(s_grpo_tspmo_credit="trie"), "s_grpo_tspmo_credit"),
        (dict(s_grpo_tspmo_keep_prob=0.0), "s_grpo_tspmo_keep_prob"),
        (dict(s_grpo_tspmo_keep_prob=1.5), "s_grpo_tspmo_keep_prob"),
        (dict(loss_type="gmpo"), "gmpo"),
    ],
)
def test_bad_flags_fail_at_config_construction(tmp_path, flags, match):
    GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="s_grpo_tspmo",
               s_grpo_tspmo_credit="sequence", s_grpo_tspmo_keep_prob=0.25, loss_type="dapo")  # valid
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="s_grpo_tspmo", **flags)
