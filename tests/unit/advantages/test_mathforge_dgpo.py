"""MathForge DGPO (DGAE + DQW) on hand-derived numbers; derivations in the comments.

Hand example, G=4, two groups: q1 = [1,0,0,0] (p=.25), q2 = [1,1,1,0] (p=.75).
DGAE q1: μ=.25, deviations [.75,−.25,−.25,−.25], Σ|·|=1.5 → Â = 4·dev/(1.5+1e-4) ≈ [2, −2/3, −2/3, −2/3].
DGAE q2: μ=.75, deviations [.25,.25,.25,−.75], Σ|·|=1.5 → Â ≈ [2/3, 2/3, 2/3, −2].
DQW, T=2, M=2: logits −.25/2 = −.125 and −.75/2 = −.375 → softmax = [σ(.25), σ(−.25)] → λ = [2σ(.25), 2σ(−.25)]
= [1.12436, 0.87564]: the harder question weighs more.
"""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages.mathforge_dgpo import mathforge_dgpo_advantages as dgpo

NAN = float("nan")
EPS = 1e-4
R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_dgae_hand_values():
    k = 4 / (1.5 + EPS)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]) * k
    torch.testing.assert_close(dgpo(R, 4, mathforge_dgpo_dqw=False), expected)


def test_dgae_plus_dqw_hand_values():
    k = 4 / (1.5 + EPS)
    lam = torch.tensor([2 * sigmoid(0.25)] * 4 + [2 * sigmoid(-0.25)] * 4)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]) * k * lam
    torch.testing.assert_close(dgpo(R, 4), expected)


def test_catalog_check_equal_update_magnitude_and_weight_decreases_with_accuracy():
    # p=.25, .5, .75 groups: Σ|Â| = G·Σ|dev|/(Σ|dev|+eps) ≈ G=4 for each (GRPO: 2G·sqrt(p(1−p))·sqrt(G/(G−1)),
    # larger at p=.5 than at .25/.75).
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    a = dgpo(r, 4, mathforge_dgpo_dqw=False).view(3, 4).abs().sum(1)
    torch.testing.assert_close(a, torch.full((3,), 4.0), atol=1e-3, rtol=0)
    # DQW weight λ_q = Σ|A_q| / Σ|Â_q| strictly decreases with accuracy .25 < .5 < .75
    w = dgpo(r, 4).view(3, 4).abs().sum(1) / a
    assert w[0] > w[1] > w[2]
    torch.testing.assert_close(w.sum(), torch.tensor(3.0))  # M·softmax: weights average 1


def _official(rewards: torch.Tensor, g: int, temp: float) -> torch.Tensor:
    """Transcription of AMAP-ML/MathForge@83edda02:trl-0.20.0/trl/trainer/grpo_trainer.py l.1680-1745 for one
    process and one reward function (scale_rewards on, enable_dgpo, enable_dgpo_dqw), without the token-count
    ratios (loss normalisers, see the variant's docstring)."""
    main = rewards
    acc = main.view(-1, g).mean(1)
    is_incorrect = torch.isclose(acc, torch.zeros_like(acc))
    std = rewards.view(-1, g).std(1)
    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    n, zero_n = acc.numel(), is_std_zero.sum()
    w = torch.ones_like(acc)
    if zero_n < n:
        acc_mod = acc.clone()
        acc_mod[is_incorrect] = 1.0
        w[~is_std_zero] = (n - zero_n) * torch.softmax(-acc_mod[~is_std_zero] / temp, dim=0)
    w = w.repeat_interleave(g)
    adv = rewards - acc.repeat_interleave(g)
    extent = adv.view(-1, g).abs().sum(1).repeat_interleave(g)
    return g * adv / (extent + 1e-4) * w


@pytest.mark.parametrize("temp", [2.0, 0.5])
def test_matches_official_code_on_a_random_binary_batch(temp):
    gen = torch.Generator().manual_seed(0)
    g = 8
    # 16 groups with accuracies spread over [0, 1], including all-0 and all-1 groups
    p = torch.linspace(0, 1, 16).repeat_interleave(g)
    r = (torch.rand(16 * g, generator=gen) < p).float()
    r[:g] = 0.0
    r[-g:] = 1.0
    torch.testing.assert_close(dgpo(r, g, mathforge_dgpo_dqw_temperature=temp), _official(r, g, temp))


def test_all_equal_groups_are_zero_and_unweighted():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0])
    a = dgpo(r, 2)
    torch.testing.assert_close(a[:6], torch.zeros(6))
    # only the last group is informative: M=1 → λ = 1·softmax(one logit) = 1; G=2: Â = 2·(∓.5)/(1+1e-4)
    m = 1.0 / (1 + EPS)
    torch.testing.assert_close(a[6:], torch.tensor([-m, m]))


def test_group_size_one_is_zero():
    torch.testing.assert_close(dgpo(torch.tensor([0.0, 1.0, 0.3]), 1), torch.zeros(3))


def test_group_size_two():
    # G=2 [0,1] and [1,1]: μ=.5, Σ|dev|=1 → ±2·.5/(1+1e-4); the second is all-equal → 0; M=1 → λ=1
    m = 1.0 / (1 + EPS)
    torch.testing.assert_close(dgpo(torch.tensor([0.0, 1.0, 1.0, 1.0]), 2), torch.tensor([-m, m, 0.0, 0.0]))


def test_nan_rewards_are_excluded_and_get_zero():
    # group [1, NaN, 0, 0]: stats over [1,0,0], n=3, μ=1/3, devs [2/3,−1/3,−1/3], Σ|·|=4/3
    # Â = 3·dev/(4/3+1e-4); only informative group → λ=1 (other group is all-NaN: 0 and out of the softmax)
    r = torch.tensor([1.0, NAN, 0.0, 0.0, NAN, NAN, NAN, NAN])
    a = dgpo(r, 4)
    k = 3 / (4 / 3 + EPS)
    torch.testing.assert_close(a, torch.tensor([2 / 3 * k, 0.0, -1 / 3 * k, -1 / 3 * k, 0, 0, 0, 0]))
    # NaN does not change the neighbours' numbers versus the same group without the unscored rollout
    torch.testing.assert_close(dgpo(torch.tensor([1.0, 0.0, 0.0]), 3), a[[0, 2, 3]])


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_reward_raises_naming_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='mathforge_dgpo'.*infinite"):
        dgpo(torch.tensor([0.0, bad, 1.0, 0.0]), 2)


def test_non_binary_rewards_and_scale_invariance_of_dgae():
    # DGAE is invariant to reward scale (up to eps): ×10 rewards give (almost) the same Â
    r = torch.tensor([0.2, 0.9, 0.4, 0.1, 0.5, 0.5, 0.3, 0.8])
    torch.testing.assert_close(dgpo(r, 4, mathforge_dgpo_dqw=False), dgpo(10 * r, 4, mathforge_dgpo_dqw=False),
                               atol=2e-3, rtol=0)


def test_bad_group_size_and_shape():
    with pytest.raises(ValueError, match="groups of 3"):
        dgpo(torch.zeros(4), 3)
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        dgpo(torch.zeros(4, 2), 2)


def test_registered_with_paper_defaults_and_validates_temperature():
    v = trl_groupx.get_variant("mathforge_dgpo")
    assert v.flags == {"advantage_estimator": "mathforge_dgpo", "mathforge_dgpo_dqw": True,
                       "mathforge_dgpo_dqw_temperature": 2.0}
    assert "83edda024759f052a4a715eb2c2e553fb9da25ca" in v.official_code
    with pytest.raises(ValueError, match="mathforge_dgpo_dqw_temperature must be > 0"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="mathforge_dgpo",
                              mathforge_dgpo_dqw_temperature=0.0)
    with pytest.raises(ValueError, match="mathforge_dgpo_dqw_temperature"):  # orphan parameter while off
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, mathforge_dgpo_dqw_temperature=1.0)
