"""GD²PO: per-reward z-scores, conflict filter, group keep ratio, whitening over kept rollouts.
Derivations in the comments; `_official` transcribes the verl code of Qwen-Applications/GD2PO@f1ad765b."""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

import trl_groupx
from trl_groupx.advantages.gd2po import conflict_keep_mask
from trl_groupx.advantages.gd2po import gd2po_advantages as gd2po

NAN = float("nan")
S3 = math.sqrt(1 / 3)  # unbiased std of [1,0,0] and of [1,1,0]


def test_hand_values_two_groups_g2():
    # m = .5/(sqrt(.5)+1e-6) is every per-reward z in a non-constant G=2 group.
    # group A rows (0,0),(1,1): z = (−m,−m),(m,m): no conflict, s = ∓2m, κ = 1.
    # group B rows (0,1),(1,0): z = (−m,m),(m,−m): conflicts with consensus 0 < .8 → dropped, κ = 0.
    # kept s = [−2m, 2m]: mean 0, unbiased var 8m² → A = ±2m/sqrt(8m²+1e-8) ≈ ±1/sqrt(2)
    r = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    m = 0.5 / (math.sqrt(0.5) + 1e-6)
    a = 2 * m / math.sqrt(8 * m * m + 1e-8)
    torch.testing.assert_close(gd2po(r, 2), torch.tensor([-a, a, 0.0, 0.0]))


def test_group_keep_ratio_scales_before_whitening():
    # G=3, d = S3 + 1e-6 (S3 = unbiased std of [1,0,0] and of [1,1,0]).
    # group 1: r1 = [1,0,0] → z1 = [2/3, −1/3, −1/3]/d; r2 = [1,1,0] → z2 = [1/3, 1/3, −2/3]/d.
    #   row 1 has z = (−1/3, 1/3)/d: conflict with consensus 0 → dropped; κ1 = 2/3.
    #   s0 = κ1·(2/3 + 1/3)/d = (2/3)/d, s2 = κ1·(−1/3 − 2/3)/d = −(2/3)/d.
    # group 2: r1 = r2 = [1,0,0]: no conflict, κ2 = 1, s = 2·[2/3, −1/3, −1/3]/d.
    r = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    d = S3 + 1e-6
    s = torch.tensor([2 / 3, 0.0, -2 / 3, 4 / 3, -2 / 3, -2 / 3]) / d
    kept = torch.tensor([True, False, True, True, True, True])
    mean, var = s[kept].mean(), s[kept].var()  # whitening over the kept rollouts, unbiased
    expected = torch.where(kept, (s - mean) / torch.sqrt(var + 1e-8), torch.zeros(6))
    torch.testing.assert_close(gd2po(r, 3), expected)


def test_catalog_check_conflict_filter():
    # (+1.2, −1.1): mixed signs, consensus .1/2.3 ≈ .043 < τ → masked; (+1, +.5): same sign → kept
    z = torch.tensor([[1.2, -1.1], [1.0, 0.5]])
    assert conflict_keep_mask(z, 0.8).tolist() == [False, True]
    assert conflict_keep_mask(z, 1.0).tolist() == [False, True]  # 'hard': every sign conflict goes
    assert conflict_keep_mask(z, 0.0).tolist() == [True, True]  # τ = 0 keeps all
    # snr: (1, −0.2) has consensus .8/1.2 = .667: dropped at τ=.8, kept at τ=.5
    z2 = torch.tensor([[1.0, -0.2]])
    assert not conflict_keep_mask(z2, 0.8).item() and conflict_keep_mask(z2, 0.5).item()


def test_threshold_changes_which_rollouts_are_kept():
    # r1=[1,0,0], r2=[0,1,0] → z1 = [2,−1,−1]/3d, z2 = [−1,2,−1]/3d: rows 0, 1 conflict with consensus 1/3
    r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    a_strict = gd2po(r, 3, gd2po_conflict_threshold=0.8)
    a_loose = gd2po(r, 3, gd2po_conflict_threshold=0.3)
    assert a_strict[0] == 0 and a_strict[1] == 0 and a_loose[0] != 0 and a_loose[1] != 0


def _official(rewards: np.ndarray, g: int, tau: float) -> torch.Tensor:
    """Transcription of ray_trainer.py `_compute_gdpo_ratio_conflict_advantages(apply_group_keep_ratio=True)` with
    one-token responses (response_mask all 1, length 1) and per-reward verl `compute_grpo_outcome_advantage`."""
    n, k = rewards.shape
    index = np.repeat(np.arange(n // g), g)
    per_reward = []
    for j in range(k):
        scores = torch.tensor(rewards[:, j], dtype=torch.float32)
        id2score = defaultdict(list)
        for i in range(n):
            id2score[index[i]].append(scores[i])
        mean, std = {}, {}
        for idx, vals in id2score.items():
            if len(vals) == 1:
                mean[idx], std[idx] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean[idx], std[idx] = torch.mean(torch.tensor(vals)), torch.std(torch.tensor([vals]))
        per_reward.append(torch.stack([(scores[i] - mean[index[i]]) / (std[index[i]] + 1e-6) for i in range(n)]))
    rollout_adv = torch.stack(per_reward, 0)  # (K, N)
    conflict = (rollout_adv > 1e-8).any(0) & (rollout_adv < -1e-8).any(0)
    ratio = rollout_adv.sum(0) / (rollout_adv.abs().sum(0) + 1e-8)
    keep = ~(conflict & (ratio.abs() < tau))
    new_adv = rollout_adv.sum(0)
    ratio_g = torch.zeros(n)
    for gid in np.unique(index):
        msk = torch.as_tensor(index == gid)
        ratio_g[msk] = keep.float()[msk].sum() / float(msk.sum())
    new_adv = new_adv * ratio_g
    filtered = new_adv * keep.float()
    w = keep.float()
    mean = (filtered * w).sum() / w.sum()
    var = (((filtered - mean) ** 2) * w).sum() / w.sum() * (w.sum() / (w.sum() - 1))
    return (filtered - mean) * torch.rsqrt(var + 1e-8) * w


@pytest.mark.parametrize("tau", [0.8, 1.0, 0.2])
def test_matches_official_code_on_random_three_reward_batch(tau):
    rng = np.random.default_rng(0)
    rewards = np.concatenate(
        [rng.integers(0, 2, (16, 1)), rng.random((16, 1)), rng.integers(0, 3, (16, 1))], axis=1
    ).astype(np.float32)
    torch.testing.assert_close(gd2po(torch.tensor(rewards), 4, gd2po_conflict_threshold=tau),
                               _official(rewards, 4, tau), atol=1e-5, rtol=1e-5)


def test_single_reward_is_gdpo_up_to_epsilons():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.2, 0.4, 0.9, 0.9])
    from trl_groupx.advantages import decoupled_normalized_advantages

    torch.testing.assert_close(gd2po(r, 4), decoupled_normalized_advantages(r.unsqueeze(1), 4), atol=1e-3, rtol=0)


def test_all_equal_groups_and_batch():
    # all-equal group: z = 0, kept, s = 0; another informative group sets the whitening
    r = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    a = gd2po(r, 2)
    # s = [0, 0, −2m, 2m]: mean 0, var (8m²)/3 → the all-equal rows stay exactly 0 here
    assert a[0] == 0 and a[1] == 0 and a[3] > 0 and a[2] == -a[3]
    # the whole batch all-equal → all 0
    torch.testing.assert_close(gd2po(torch.ones(4, 2), 2), torch.zeros(4))


def test_group_size_one_and_two():
    torch.testing.assert_close(gd2po(torch.tensor([[0.3, 1.0], [0.9, 0.0]]), 1), torch.zeros(2))
    r = torch.tensor([[0.0, 0.0], [1.0, 1.0]])  # G=2 single group: ±1/sqrt(2) (see the first test)
    m = 0.5 / (math.sqrt(0.5) + 1e-6)
    a = 2 * m / math.sqrt(8 * m * m + 1e-8)
    torch.testing.assert_close(gd2po(r, 2), torch.tensor([-a, a]))


def test_nan_entries_excluded_and_unscored_rows_zero():
    # Inserting an unscored row (all NaN) into a group changes nothing for the others: stats, conflicts, keep
    # ratio (scored rows only) and whitening skip it, and it gets 0.
    base = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    with_nan = torch.tensor([[0.0, 0.0], [NAN, NAN], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [NAN, NAN]])
    a, b = gd2po(base, 2), gd2po(with_nan, 3)
    assert b[1] == 0 and b[5] == 0
    torch.testing.assert_close(b[[0, 2, 3, 4]], a)
    # a single NaN entry: that function's stats skip it and it adds 0. Group [(0,0),(1,NaN),(1,1)]:
    # z1 over [0,1,1], z2 over [0,1] only; row 1 has z2 = 0 → no conflict from it.
    r = torch.tensor([[0.0, 0.0], [1.0, NAN], [1.0, 1.0]])
    out = gd2po(r, 3)
    assert torch.isfinite(out).all() and out[0] < 0 < out[2]


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_reward_raises_naming_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='gd2po'.*infinite"):
        gd2po(torch.tensor([[0.0, 1.0], [bad, 0.0]]), 2)


def test_validate_threshold_range_and_flags():
    v = trl_groupx.get_variant("gd2po")
    assert v.flags["gd2po_conflict_threshold"] == 0.8 and v.requires == ("rewards_per_func",)
    assert "f1ad765bc9a330e6cf387f95e9c1e5a6c4bb2d02" in v.official_code
    with pytest.raises(ValueError, match=r"gd2po_conflict_threshold must lie in \[0, 1\]"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="gd2po",
                              gd2po_conflict_threshold=1.5)
