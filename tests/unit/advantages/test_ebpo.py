"""EBPO: running global prior (Welford), shrinkage baseline, batch scaling; derivations in the comments."""

import io
import math

import numpy as np
import pytest
import torch

import trl_groupx
from trl_groupx.advantages.ebpo import ebpo_advantages as ebpo
from trl_groupx.advantages.ebpo import ebpo_state_stats

NAN = float("nan")


def test_hand_values_first_step_unscaled_and_scaled():
    # G=2 groups [1,0], [1,1], empty state (the batch itself is the prior):
    # μ = .75; group means [.5, 1] → τ² = unbiased var = .125; σ² = pooled within = (.5 + 0)/(1 + 1) = .25
    # S = (σ²/2)/(σ²/2 + τ²) = .125/.25 = .5; b = [.5·.5+.5·.75, .5·1+.5·.75] = [.625, .875]
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    state = {}
    a = ebpo(r, 2, ebpo_scale_rewards="none", state=state)
    torch.testing.assert_close(a, torch.tensor([0.375, -0.625, 0.125, 0.125]))
    stats = ebpo_state_stats(state)
    assert stats["mean"].item() == 0.75 and stats["tau2"].item() == 0.125 and stats["sigma2"].item() == 0.25
    # batch scaling: unbiased std of [1,0,1,1] = .5 → A / (.5 + 1e-4)
    torch.testing.assert_close(ebpo(r, 2, state={}), torch.tensor([0.375, -0.625, 0.125, 0.125]) / (0.5 + 1e-4))


def test_catalog_check_welford_equals_numpy_over_batches():
    gen = torch.Generator().manual_seed(0)
    state, seen, means = {}, [], []
    for _ in range(5):
        r = torch.rand(12, generator=gen)
        ebpo(r, 4, state=state)
        seen.append(r.double().numpy())
        means.append(r.double().view(3, 4).mean(1).numpy())
    stats = ebpo_state_stats(state)
    all_r, all_m = np.concatenate(seen), np.concatenate(means)
    assert state["reward_count"] == 60 and state["group_count"] == 15
    np.testing.assert_allclose(stats["mean"].item(), all_r.mean(), rtol=1e-12)
    np.testing.assert_allclose(stats["var"].item(), all_r.var(ddof=1), rtol=1e-10)
    np.testing.assert_allclose(stats["tau2"].item(), all_m.var(ddof=1), rtol=1e-10)
    within = np.concatenate([s.reshape(3, 4) - s.reshape(3, 4).mean(1, keepdims=True) for s in seen])
    np.testing.assert_allclose(stats["sigma2"].item(), (within**2).sum() / (15 * 3), rtol=1e-10)


def test_catalog_check_all_zero_group_gets_negative_nonzero_advantages():
    state = {}
    ebpo(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 5, state=state)  # global mean .4
    a = ebpo(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]), 5, state=state)
    assert (a[:5] < 0).all()  # GRPO would give exactly 0 here
    assert torch.allclose(a[:5], a[:1].expand(5))  # the same penalty for every member


def _prior(mean=0.4, sigma2=0.24, tau2=0.05, n=10**9):
    """A state whose statistics a single small batch cannot move (n huge)."""
    f = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return {"reward_count": n, "reward_mean": f(mean), "reward_m2": f(0.29 * (n - 1)), "group_count": n,
            "group_mean": f(mean), "group_m2": f(tau2 * (n - 1)), "within_ss": f(sigma2 * n), "within_dof": n}


@pytest.mark.parametrize("g", [1, 2, 4, 16, 64])
def test_catalog_check_shrinkage_weight_tends_to_group_mean(g):
    # one group with mean r̄ (3/4 ones; all ones for G ≤ 2) against a fixed prior μ=.4, σ²=.24, τ²=.05:
    # unscaled, Σ_i A_i / n = r̄ − b = S (r̄ − μ), S = (σ²/G)/(σ²/G + τ²) → 0 as G grows
    ones = max(1, (3 * g) // 4)
    r = torch.tensor([1.0] * ones + [0.0] * (g - ones))
    rbar = ones / g  # 1 for G=1 and 2, .75 otherwise
    a = ebpo(r, g, ebpo_scale_rewards="none", state=_prior())
    s = (0.24 / g) / (0.24 / g + 0.05)
    assert a.double().mean().item() == pytest.approx(s * (rbar - 0.4), rel=1e-5)


def test_group_size_one_still_gets_signal():
    # with a prior (μ=.4, σ²=.24, τ²=.05), G=1: S = .24/.29, A = S (r − μ) ≠ 0 (GRPO gives 0)
    a = ebpo(torch.tensor([1.0, 0.0]), 1, ebpo_scale_rewards="none", state=_prior())
    s = 0.24 / 0.29
    torch.testing.assert_close(a, torch.tensor([s * 0.6, -s * 0.4]), rtol=1e-5, atol=1e-6)


def test_all_equal_batch_on_first_step_is_zero_and_group_size_two():
    torch.testing.assert_close(ebpo(torch.ones(4), 2, state={}), torch.zeros(4))
    torch.testing.assert_close(ebpo(torch.ones(4), 1, state={}), torch.zeros(4))
    a = ebpo(torch.tensor([0.0, 1.0]), 2, state={})  # one group: μ = r̄ → b = r̄ whatever S: ±.5/(std .7071+ε)
    m = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(a, torch.tensor([-m, m]))


def test_zero_spread_batch_falls_back_to_global_std():
    state = {}
    ebpo(torch.tensor([1.0, 0.0, 1.0, 0.0]), 2, state=state)
    a = ebpo(torch.zeros(4), 2, state=state)  # batch std 0 → running std of all 8 rewards (finite, no 1/ε blow-up)
    assert (a < 0).all() and a.abs().max() < 10


def test_nan_rewards_are_excluded_from_state_and_get_zero():
    state = {}
    a = ebpo(torch.tensor([1.0, NAN, 0.0, NAN, NAN, NAN]), 3, state=state)
    assert a[1] == 0 and (a[3:] == 0).all() and torch.isfinite(a).all()
    assert state["reward_count"] == 2 and state["group_count"] == 1 and state["within_dof"] == 1
    # the same as the group without its unscored member
    torch.testing.assert_close(a[[0, 2]], ebpo(torch.tensor([1.0, 0.0]), 2, state={}))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_reward_raises_naming_the_flag(bad):
    state = {}
    with pytest.raises(ValueError, match="advantage_estimator='ebpo'.*infinite"):
        ebpo(torch.tensor([0.0, bad]), 2, state=state)
    assert state == {}  # nothing recorded


def test_state_round_trips_through_torch_save_and_continues_exactly():
    gen = torch.Generator().manual_seed(1)
    batches = [torch.rand(8, generator=gen).round() for _ in range(4)]
    straight = {}
    outs = [ebpo(b, 4, state=straight) for b in batches]
    resumed = {}
    for b in batches[:2]:
        ebpo(b, 4, state=resumed)
    buf = io.BytesIO()
    torch.save({"ebpo": resumed}, buf)
    buf.seek(0)
    resumed = torch.load(buf, weights_only=True)["ebpo"]  # what the trainer does with a checkpoint
    for b, expected in zip(batches[2:], outs[2:]):
        assert torch.equal(ebpo(b, 4, state=resumed), expected)
    assert resumed.keys() == straight.keys()
    for k in straight:
        assert torch.equal(torch.as_tensor(resumed[k]), torch.as_tensor(straight[k])), k


def test_registered_stateful_and_validates():
    v = trl_groupx.get_variant("ebpo")
    assert v.stateful and v.params == ("ebpo_scale_rewards",)
    with pytest.raises(ValueError, match="ebpo_scale_rewards must be 'batch' or 'none'"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="ebpo",
                              ebpo_scale_rewards="group")
