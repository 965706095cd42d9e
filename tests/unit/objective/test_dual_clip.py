"""Dual-clip PPO (`loss_type="dual_clip"`): verl's vanilla policy loss, hand-derived values and gradients."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, dual_clip_surrogate

KW = dict(epsilon=0.2, epsilon_high=None, dual_clip_c=3.0)


def ctx_of(log_ratio, adv):
    """One row, old log-probs 0, so logp = log ρ; (1, T) token advantages."""
    logps = torch.tensor([log_ratio], requires_grad=True)
    n = len(log_ratio)
    return ObjectiveContext(logps, torch.zeros(1, n), torch.tensor([adv]), torch.ones(1, n)), logps


def test_hand_values_and_gradients():
    # token: (log ρ, A) → PPO loss l¹ = max(-Aρ, -A·clip(ρ, .8, 1.2)); dual: min(l¹, -A·3) if A < 0
    #  0: ( 1.5, -1) ρ=4.4817 → l¹ = max(4.4817, 1.2) = 4.4817 → min(·, 3) = 3           grad 0 (capped)
    #  1: ( 0.5, -1) ρ=1.6487 → l¹ = max(1.6487, 1.2) = 1.6487 < 3                      grad dl/dlogp = -Aρ = 1.6487
    #  2: (-0.5, -1) ρ=0.6065 → l¹ = max(0.6065, 0.8) = 0.8 (clipped)                  grad 0
    #  3: ( 1.5, +1) ρ=4.4817 → l¹ = max(-4.4817, -1.2) = -1.2 (clipped, no cap for A>0) grad 0
    #  4: (-2.0, +1) ρ=0.1353 → l¹ = max(-0.1353, -0.8) = -0.1353                       grad -ρ = -0.1353
    #  5: ( 0.3,  0) → 0                                                                 grad 0
    ctx, logps = ctx_of([1.5, 0.5, -0.5, 1.5, -2.0, 0.3], [-1.0, -1.0, -1.0, 1.0, 1.0, 0.0])
    loss = dual_clip_surrogate(ctx, **KW)
    expected = [3.0, math.exp(0.5), 0.8, -1.2, -math.exp(-2.0), 0.0]
    torch.testing.assert_close(loss, torch.tensor([expected]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, math.exp(0.5), 0.0, 0.0, -math.exp(-2.0), 0.0]]))


def test_differs_from_grpo_only_where_capped():
    ctx, _ = ctx_of([1.5, 0.5, -0.5, 1.5, -2.0], [-1.0, -1.0, -1.0, 1.0, 1.0])
    ppo = clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token")
    dual = dual_clip_surrogate(ctx, **KW)
    assert ppo[0, 0].item() == pytest.approx(math.exp(1.5))  # PPO: unbounded -Aρ for A<0
    assert dual[0, 0].item() == pytest.approx(3.0)
    torch.testing.assert_close(ppo[:, 1:], dual[:, 1:])


def test_large_cap_is_ppo_and_on_policy_is_grpo():
    # c → ∞ removes the cap (PPO); at ρ = 1 nothing is clipped or capped (GRPO's surrogate) — values and gradients
    torch.manual_seed(0)
    adv = torch.randn(4, 7)
    for log_ratio, c in ((torch.randn(4, 7), 1e9), (torch.zeros(4, 7), 3.0)):
        a = ObjectiveContext(log_ratio.clone().requires_grad_(), torch.zeros(4, 7), adv, torch.ones(4, 7))
        b = ObjectiveContext(log_ratio.clone().requires_grad_(), torch.zeros(4, 7), adv, torch.ones(4, 7))
        la = dual_clip_surrogate(a, epsilon=0.2, epsilon_high=0.28, dual_clip_c=c)
        lb = clipped_surrogate(b, epsilon=0.2, epsilon_high=0.28, delta=None, importance_sampling_level="token")
        torch.testing.assert_close(la, lb)
        la.sum().backward()
        lb.sum().backward()
        torch.testing.assert_close(a.logps.grad, b.logps.grad)


def test_decoupled_bounds_and_extreme_log_ratio():
    # ε_high = .28: ρ = 1.25 unclipped for A>0 (grad -ρ); log ρ = 50 for A<0 → verl's ±20 clamp, capped at 3;
    # log ρ = -50 for A>0 → clamped to -20: l = max(-e^-20, -.8) = -e^-20, and the clamp stops the gradient
    ctx, logps = ctx_of([math.log(1.25), 50.0, -50.0], [1.0, -1.0, 1.0])
    loss = dual_clip_surrogate(ctx, epsilon=0.2, epsilon_high=0.28, dual_clip_c=3.0)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, 3.0, -math.exp(-20.0)]]))
    loss.sum().backward()
    assert torch.isfinite(logps.grad).all()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.25, 0.0, 0.0]]))


def test_padding_is_not_read_through_aggregation():
    logps = torch.tensor([[0.5, 30.0]], requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(1, 2), torch.tensor([[-1.0]]), torch.tensor([[1.0, 0.0]]))
    loss = aggregate(dual_clip_surrogate(ctx, **KW), ctx.mask, "global_token_mean", global_num_tokens=1.0)
    assert loss.item() == pytest.approx(math.exp(0.5))
    loss.backward()
    assert logps.grad[0, 1].item() == 0.0


def test_flags_and_validation():
    v = get_variant("dual_clip")
    assert v.flags["dual_clip_c"] == 3.0 and v.flags["loss_aggregation"] == "global_token_mean"
    assert v.params == ("dual_clip_c",)
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    GRPOConfig(**common, **v.flags)
    for bad in (1.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="dual_clip_c"):
            GRPOConfig(**common, loss_type="dual_clip", dual_clip_c=bad)
    with pytest.raises(ValueError, match="dual_clip_c=5.0 belongs to variant 'dual_clip'"):
        GRPOConfig(**common, loss_type="grpo", dual_clip_c=5.0)
