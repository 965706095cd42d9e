"""HAPO Asymmetric Adaptive Clipping (`loss_type="hapo_clip"`): hand-derived bounds, values and gradients (paper
and official sign), the official formula on a fixture, edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, dual_clip_surrogate, hapo_clip_surrogate

KW = {"epsilon": 0.2, "epsilon_high": 0.2, "hapo_clip_alpha": 1.0, "hapo_clip_entropy_pivot": 0.8, "hapo_clip_c": 10.0}

# Entropies with log H = (-2, -1, 0, 1, 2): pivot = 0.8-quantile "nearest" = sorted[round(0.8·4) = 3] = 1,
# h = ℓ - 1 = (-3, -2, -1, 0, 1) / RMS; ĥ = h / max h⁺ (= 1 → ĥ = 1) or h / |min h⁻| (= 3) — the RMS cancels:
#   paper ĥ = (-1, -2/3, -1/3, 0, 1);  official (scale_neg = 1/neg_min) ĥ = |ĥ| = (1, 2/3, 1/3, 0, 1)
# bounds (α = 1, ε = .2): paper   ε_low = .2(1 - ĥ) if ĥ ≤ 0 = (.4, 1/3, 4/15, .2, .2),  ε_high = (.2, .2, .2, .2, .4)
#                         official ε_low = .2 (ĥ ≤ 0 only at ĥ = 0, factor 1),  ε_high = .2(1 + ĥ) if ĥ > 0
#                                  = (.4, 1/3, 4/15, .2, .4)
ENTROPY = torch.exp(torch.tensor([[-2.0, -1.0, 0.0, 1.0, 2.0]]))
# token: (ρ, A)
RATIO = [0.65, 1.3, 0.75, 1.1, 1.35]
ADV = [-1.0, 1.0, -1.0, 1.0, 1.0]


def ctx_of(ratio=RATIO, adv=ADV, entropies=ENTROPY, mask=None):
    logps = torch.log(torch.tensor([ratio])).requires_grad_()
    n = len(ratio)
    mask = torch.ones(1, n) if mask is None else mask
    return ObjectiveContext(logps, torch.zeros(1, n), torch.tensor([adv]), mask, entropies), logps


def test_paper_sign_values_and_gradients():
    #  0: ρ .65, A -1, lower bound 1 - .4 = .6 → unclipped: l = .65, dl/dlogp = -Aρ = .65   (GRPO: clipped at .8)
    #  1: ρ 1.3, A +1, upper 1.2 → l = max(-1.3, -1.2) = -1.2 clipped, grad 0
    #  2: ρ .75, A -1, lower 1 - 4/15 = .7333 → unclipped l = .75, grad .75                 (GRPO: .8, grad 0)
    #  3: ρ 1.1, A +1, in [.8, 1.2] → l = -1.1, grad -1.1
    #  4: ρ 1.35, A +1, upper 1.4 → unclipped l = -1.35, grad -1.35                          (GRPO: -1.2, grad 0)
    ctx, logps = ctx_of()
    loss = hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=False)
    torch.testing.assert_close(loss, torch.tensor([[0.65, -1.2, 0.75, -1.1, -1.35]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.65, 0.0, 0.75, -1.1, -1.35]]))


def test_official_sign_values_and_gradients():
    #  0: lower bound .8 (ε_low never adapts) → l = max(.65, .8) = .8 clipped, grad 0
    #  1: upper 1 + 1/3 → unclipped l = -1.3, grad -1.3 (a low-entropy token gets more room up: the official bug)
    #  2: lower .8 → l = .8, grad 0;   3: l = -1.1, grad -1.1;   4: upper 1.4 → l = -1.35, grad -1.35
    ctx, logps = ctx_of()
    loss = hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=True)
    torch.testing.assert_close(loss, torch.tensor([[0.8, -1.3, 0.8, -1.1, -1.35]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -1.3, 0.0, -1.1, -1.35]]))


def test_dual_clip_cap_for_negative_advantages():
    # equal entropies → h = 0 → ĥ = 0 → base bounds; A = -1, ρ = e^3 ≈ 20.09: PPO l¹ = max(20.09, 1.2) = 20.09,
    # capped at -A·c = 10 (grad 0); with c = ∞ no cap: 20.09, grad -Aρ = 20.09.  A = +1, ρ = e^3: -1.2, grad 0.
    flat = torch.ones(1, 2)
    for c, value, grad in ((10.0, 10.0, 0.0), (float("inf"), math.exp(3), math.exp(3))):
        ctx, logps = ctx_of([math.exp(3), math.exp(3)], [-1.0, 1.0], flat)
        loss = hapo_clip_surrogate(ctx, **{**KW, "hapo_clip_c": c}, hapo_clip_official_sign=False)
        torch.testing.assert_close(loss, torch.tensor([[value, -1.2]]))
        loss.sum().backward()
        torch.testing.assert_close(logps.grad, torch.tensor([[grad, 0.0]]))


def test_alpha_zero_is_dual_clip_ppo_and_on_policy_is_grpo():
    torch.manual_seed(0)
    entropies, adv, mask = torch.rand(4, 7) * 3, torch.randn(4, 7), torch.ones(4, 7)
    mask[1, 4:] = 0
    for log_ratio, alpha in ((0.3 * torch.randn(4, 7), 0.0), (torch.zeros(4, 7), 1.0)):
        a = ObjectiveContext(log_ratio.clone().requires_grad_(), torch.zeros(4, 7), adv, mask, entropies)
        b = ObjectiveContext(log_ratio.clone().requires_grad_(), torch.zeros(4, 7), adv, mask, entropies)
        la = hapo_clip_surrogate(a, **{**KW, "hapo_clip_alpha": alpha}, hapo_clip_official_sign=False) * mask
        lb = dual_clip_surrogate(b, epsilon=0.2, epsilon_high=0.2, dual_clip_c=10.0) * mask
        torch.testing.assert_close(la, lb)
        la.sum().backward()
        lb.sum().backward()
        torch.testing.assert_close(a.logps.grad, b.logps.grad)


def official_compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, entropy, pivot, clip_alpha, c):
    """The formula of starriver030515/HAPO@7671dde3…:verl/trainer/ppo/core_algos.py (compute_entropy_h l.86-128,
    ada_clip l.131-144, compute_policy_loss l.727-821 with adaptive_clip, token-mean), re-derived from reading it."""
    mask = response_mask.bool()
    ent = torch.log(entropy.clamp_min(1e-8))
    median = torch.quantile(ent[mask], pivot, interpolation="nearest")
    h = ent - median
    n = mask.sum().clamp_min(1.0)
    h = h / (h.pow(2).masked_fill(~mask, 0.0).sum() / n).clamp_min(1e-8).sqrt()
    pos_max = h.masked_fill(~(mask & (h > 0)), 0.0).max().clamp_min(1e-8)
    neg_min = h.masked_fill(~(mask & (h < 0)), 0.0).min().clamp_max(-1e-8)
    h_hat = torch.where(h > 0, h * (1.0 / pos_max), h * (1.0 / neg_min))
    low, high = torch.full_like(h_hat, 0.2), torch.full_like(h_hat, 0.2)
    low_ent, high_ent = low * (1 - h_hat * clip_alpha), high * (1 + h_hat * clip_alpha)
    low[h_hat <= 0] = low_ent[h_hat <= 0]
    high[h_hat > 0] = high_ent[h_hat > 0]
    ratio = torch.exp(log_prob - old_log_prob)
    l1 = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - low, 1 + high))
    l2 = torch.min(-advantages * c, l1)
    losses = torch.where(advantages < 0, l2, l1)
    return (losses * response_mask).sum() / response_mask.sum()


def test_matches_the_official_code_on_a_random_fixture():
    # 36 loss tokens: 0.8·35 = 28 is an integer, so "nearest" has no rounding tie (torch.quantile stands in for the
    # official torch_quantile); verl broadcasts the sequence advantage over (B, T)
    torch.manual_seed(3)
    b, t = 5, 9
    lengths = torch.tensor([9, 8, 9, 1, 9])
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    assert mask.sum() == 36
    old = -torch.rand(b, t) * 3
    new = (old + 0.4 * torch.randn(b, t)).requires_grad_()
    adv = torch.randn(b, 1)
    entropies = torch.rand(b, t) * 4 + 0.01
    official = official_compute_policy_loss(old, new, adv.expand(b, t), mask, entropies, 0.8, 1.0, 10.0)
    (g_official,) = torch.autograd.grad(official, new)
    ctx = ObjectiveContext(new, old, adv, mask, entropies)
    ours = aggregate(hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=True), mask, "token_mean")
    (g_ours,) = torch.autograd.grad(ours, new)
    torch.testing.assert_close(ours, official)
    torch.testing.assert_close(g_ours, g_official)
    # the paper sign differs on this fixture (low-entropy tokens get a wider lower bound, not a wider upper one)
    paper = aggregate(hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=False), mask, "token_mean")
    assert not torch.allclose(paper, ours)


def test_padding_is_never_read():
    # padding entropies and log-ratios are extreme; the result equals the unpadded row and the gradient there is 0
    ctx, _ = ctx_of()
    ref = hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=False)
    logps = torch.cat([torch.log(torch.tensor([RATIO])), torch.tensor([[90.0, -90.0]])], 1).requires_grad_()
    entropies = torch.cat([ENTROPY, torch.tensor([[1e6, 0.0]])], 1)
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0, 0]])
    padded = ObjectiveContext(logps, torch.zeros(1, 7), torch.tensor([ADV + [-1.0, 1.0]]), mask, entropies)
    loss = hapo_clip_surrogate(padded, **KW, hapo_clip_official_sign=False)
    torch.testing.assert_close(loss[:, :5], ref)
    assert (loss[:, 5:] == 0).all()
    loss.sum().backward()
    assert torch.isfinite(logps.grad).all() and (logps.grad[:, 5:] == 0).all()


def test_empty_and_all_equal_entropies():
    # no loss token at all: 0 and finite; one token only: ĥ = 0 (h = 0), base bounds
    ctx = ObjectiveContext(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3), torch.ones(2, 1),
                           torch.zeros(2, 3), torch.rand(2, 3))
    out = hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=False)
    assert (out == 0).all()
    ctx, _ = ctx_of([1.3], [1.0], torch.ones(1, 1))
    loss = hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=False)
    torch.testing.assert_close(loss, torch.tensor([[-1.2]]))


def test_without_entropies_the_base_bounds_apply_with_a_warning():
    # ρ = 1.3, A = +1 → clipped at 1.2 (base bound): -1.2
    ctx = ObjectiveContext(torch.log(torch.tensor([[1.3]])), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    with pytest.warns(UserWarning, match="entropies"):
        out = hapo_clip_surrogate(ctx, **KW, hapo_clip_official_sign=False)
    torch.testing.assert_close(out, torch.tensor([[-1.2]]))


def test_registration_and_validation():
    v = get_variant("hapo_clip")
    assert v.stage == "objective" and v.flags["hapo_clip_c"] == 10.0 and v.flags["hapo_clip_official_sign"] is False
    assert set(v.params) == {"hapo_clip_alpha", "hapo_clip_entropy_pivot", "hapo_clip_c", "hapo_clip_official_sign"}
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **v.flags)
    for name, bad in (("hapo_clip_entropy_pivot", 1.5), ("hapo_clip_alpha", -1.0), ("hapo_clip_c", 1.0),
                      ("hapo_clip_alpha", float("nan"))):
        with pytest.raises(ValueError, match=name):
            GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **{**v.flags, name: bad})


def test_bounds_switch_at_the_entropy_threshold():
    # catalog check: ĥ ≤ 0 (below the pivot) moves only the lower bound, ĥ > 0 only the upper one
    # ĥ = (-.5, 0, .5), α = 1, ε = (.2, .3): low = (.2·1.5, .2, .2) = (.3, .2, .2), high = (.3, .3, .3·1.5 = .45)
    from trl_groupx.objective import hapo_clip_bounds

    low, high = hapo_clip_bounds(torch.tensor([-0.5, 0.0, 0.5]), 0.2, 0.3, 1.0)
    torch.testing.assert_close(low, torch.tensor([0.3, 0.2, 0.2]))
    torch.testing.assert_close(high, torch.tensor([0.3, 0.3, 0.45]))


def test_all_features_off_is_dapo_bit_exact():
    # catalog check: α = 0 and no dual clip (c = ∞) → TRL's clipped surrogate (DAPO's per-token loss), bit for bit
    from trl_groupx.objective import clipped_surrogate

    torch.manual_seed(2)
    mask = torch.ones(3, 6)
    mask[0, 4:] = 0
    log_ratio = 0.3 * torch.randn(3, 6)
    adv = torch.randn(3, 1)
    a = ObjectiveContext(log_ratio.clone().requires_grad_(), torch.zeros(3, 6), adv, mask, torch.rand(3, 6))
    b = ObjectiveContext(log_ratio.clone().requires_grad_(), torch.zeros(3, 6), adv, mask, torch.rand(3, 6))
    la = aggregate(hapo_clip_surrogate(a, **{**KW, "hapo_clip_alpha": 0.0, "hapo_clip_c": float("inf")},
                                       hapo_clip_official_sign=False), mask, "global_token_mean", global_num_tokens=16.0)
    lb = aggregate(clipped_surrogate(b, epsilon=0.2, epsilon_high=0.2, delta=None, importance_sampling_level="token"),
                   mask, "global_token_mean", global_num_tokens=16.0)
    assert torch.equal(la, lb)
    la.backward()
    lb.backward()
    assert torch.equal(a.logps.grad, b.logps.grad)
