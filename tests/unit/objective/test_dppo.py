"""DPPO-Binary-TV / -KL (`loss_type="dppo_tv"`, `"dppo_kl"`): divergence trust region on the sampled token."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, dppo_kl_surrogate, dppo_tv_surrogate

L = math.log
# five tokens, all with p_old = .5; (p, A):
#  0: (.7, +1) p went up by .2          1: (.6, +1) up by .1        2: (.3, -1) down by .2
#  3: (.7, -1) up (against A<0's push)  4: (.3, +1) down (against A>0's push)
P = [0.7, 0.6, 0.3, 0.7, 0.3]
ADV = [1.0, 1.0, -1.0, -1.0, 1.0]


def ctx_of(p=P, adv=ADV, p_old=0.5):
    logps = torch.tensor([[L(x) for x in p]], requires_grad=True)
    old = torch.full((1, len(p)), L(p_old))
    return ObjectiveContext(logps, old, torch.tensor([adv]), torch.ones(1, len(p))), logps


def test_tv_hand_values_and_gradient():
    # δ = .15: token 0 (Δ=.2 > δ, A>0) and token 2 (Δ=-.2 < -δ, A<0) leave the region → loss 0, grad 0.
    # others: l = -A·sg(ρ)·logp with ρ = p/.5: 1: -1.2·log .6; 3: +1.4·log .7; 4: -.6·log .3; grad = -A·ρ
    ctx, logps = ctx_of()
    loss = dppo_tv_surrogate(ctx, dppo_tv_delta=0.15, dppo_tv_is_cap=10000.0)
    expected = [0.0, -1.2 * L(0.6), 0.0, 1.4 * L(0.7), -0.6 * L(0.3)]
    torch.testing.assert_close(loss, torch.tensor([expected]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -1.2, 0.0, 1.4, -0.6]]))


def test_kl_hand_values_and_gradient():
    # binary KL(old=.5 ‖ p) = .5 log(.5/p) + .5 log(.5/(1-p)):
    #   p=.7 or .3 → .5(log(5/7) + log(5/3)) = .087177 > δ=.05;  p=.6 → .5(log(5/6) + log(5/4)) = .020411 ≤ δ
    # token 0: A>0, p up, KL .087 > .05 → out; 1: inside; 2: A<0, p down, KL .087 → out;
    # 3: A<0 but p went up → kept whatever the KL; 4: A>0 but p went down → kept
    assert 0.5 * (L(5 / 7) + L(5 / 3)) == pytest.approx(0.087177, abs=1e-6)
    assert 0.5 * (L(5 / 6) + L(5 / 4)) == pytest.approx(0.020411, abs=1e-6)
    ctx, logps = ctx_of()
    loss = dppo_kl_surrogate(ctx, dppo_kl_delta=0.05, dppo_kl_is_cap=10000.0)
    torch.testing.assert_close(loss, torch.tensor([[0.0, -1.2 * L(0.6), 0.0, 1.4 * L(0.7), -0.6 * L(0.3)]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -1.2, 0.0, 1.4, -0.6]]))
    # a wider KL radius (.1 > .087) keeps every token: gradient -Aρ everywhere
    ctx, logps = ctx_of()
    dppo_kl_surrogate(ctx, dppo_kl_delta=0.1, dppo_kl_is_cap=10000.0).sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.4, -1.2, 0.6, 1.4, -0.6]]))


@pytest.mark.parametrize("fn, kw", [(dppo_tv_surrogate, "dppo_tv"), (dppo_kl_surrogate, "dppo_kl")])
def test_is_cap_truncates_the_detached_weight(fn, kw):
    # cap C = 1.1: token 1 (ρ = 1.2) weight → 1.1, token 3 (ρ = 1.4) → 1.1; token 4 (ρ = .6) unchanged
    ctx, logps = ctx_of()
    fn(ctx, **{f"{kw}_delta": 0.15 if kw == "dppo_tv" else 0.05, f"{kw}_is_cap": 1.1}).sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -1.1, 0.0, 1.1, -0.6]]))


@pytest.mark.parametrize("fn, kw", [(dppo_tv_surrogate, "dppo_tv"), (dppo_kl_surrogate, "dppo_kl")])
def test_on_policy_is_grpo_gradient_and_padding_not_read(fn, kw):
    # ρ = 1, divergence 0 → every token inside: gradient -A, as GRPO's at ρ = 1; padding (old -200) stays finite
    logps = torch.tensor([[L(0.4), L(0.9), -3.0]], requires_grad=True)
    old = torch.tensor([[L(0.4), L(0.9), -200.0]])
    ctx = ObjectiveContext(logps, old, torch.tensor([[-0.7]]), torch.tensor([[1.0, 1.0, 0.0]]))
    loss = fn(ctx, **{f"{kw}_delta": 0.05, f"{kw}_is_cap": 10000.0})
    assert torch.isfinite(loss).all()
    aggregate(loss, ctx.mask, "constant", max_completion_length=4).backward()
    # constant: Σ l m / (B · 4) → d/dlogp = -A/4 = .175 on real tokens, 0 on padding
    torch.testing.assert_close(logps.grad, torch.tensor([[0.175, 0.175, 0.0]]))


def test_flags_and_validation():
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    tv, kl = get_variant("dppo_tv"), get_variant("dppo_kl")
    assert tv.flags["dppo_tv_delta"] == 0.15 and kl.flags["dppo_kl_delta"] == 0.05
    assert tv.flags["loss_aggregation"] == kl.flags["loss_aggregation"] == "constant"  # seq-mean-token-sum-norm
    GRPOConfig(**common, **tv.flags)
    GRPOConfig(**common, **kl.flags)
    with pytest.raises(ValueError, match="dppo_tv_delta"):
        GRPOConfig(**common, loss_type="dppo_tv", dppo_tv_delta=0.0)
    with pytest.raises(ValueError, match="dppo_kl_is_cap"):
        GRPOConfig(**common, loss_type="dppo_kl", dppo_kl_is_cap=0.5)
    with pytest.raises(ValueError, match="belongs to variant 'dppo_kl'"):
        GRPOConfig(**common, loss_type="dppo_tv", dppo_kl_delta=0.1)
