"""CTPO (`loss_type="ctpo"`): cumulative token ratio, position-adaptive log clip, dual clip — hand-derived values
and gradients, the official code's formula on random inputs, edge cases and validation."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, ctpo_surrogate

KW = {
    "ctpo_clip_low": 0.025,
    "ctpo_clip_high": 0.05,
    "ctpo_clip_c": 0.05,
    "ctpo_power": 0.5,
    "ctpo_ratio_mode": "cumprod",
}
S2, S3 = math.sqrt(2.0), math.sqrt(3.0)


def ctx_of(log_ratios, adv, mask=None):
    """Rows of log ρ (old log-probs 0, so logp = log ρ); advantages (B, 1)."""
    logps = torch.tensor(log_ratios, requires_grad=True)
    mask = torch.ones_like(logps) if mask is None else torch.tensor(mask)
    return ObjectiveContext(logps, torch.zeros_like(logps), torch.tensor(adv).reshape(-1, 1), mask), logps


def test_catalog_check_cumulative_ratio_and_position_clip():
    # token log-ratios [0.1, -0.2, 0.3] → cumulative L = [0.1, -0.1, 0.2]; positions t = 1, 2, 3, s_t = √t;
    # window [-0.025 s_t, 0.05 s_t] = [-0.025, 0.05], [-0.0354, 0.0707], [-0.0433, 0.0866]
    # row A=+1: l¹ = max(-ρ, -ρ̃)
    #   t1: L=.1  > .05   → ρ̃ = e^.05 → l = -e^.05  (clipped, grad 0)
    #   t2: L=-.1 < -.0354 → max(-e^-.1, -e^-.0354) = -e^-.1 (unclipped branch; grad -ρ = -e^-.1 on logp_2 only)
    #   t3: L=.2  > .0866  → -e^{.05√3} (clipped, grad 0)
    # row A=-1: l¹ = max(ρ, ρ̃), then min(·, e^{.05 s_t})
    #   t1: max(e^.1, e^.05) = e^.1 → capped at e^.05 (grad 0)
    #   t2: max(e^-.1, e^-.0354) = e^{-.025√2} (clipped at the lower bound, grad 0)
    #   t3: max(e^.2, e^.0866) = e^.2 → capped at e^{.05√3} (grad 0)
    # row A=-1, small ratios [0.02, 0.01]: L = [.02, .03] inside both windows → l = ρ, grad ρ
    ctx, logps = ctx_of(
        [[0.1, -0.2, 0.3], [0.1, -0.2, 0.3], [0.02, 0.01, 0.0]],
        [1.0, -1.0, -1.0],
        mask=[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
    )
    loss = ctpo_surrogate(ctx, **KW)
    expected = torch.tensor(
        [
            [-math.exp(0.05), -math.exp(-0.1), -math.exp(0.05 * S3)],
            [math.exp(0.05), math.exp(-0.025 * S2), math.exp(0.05 * S3)],
            [math.exp(0.02), math.exp(0.03), 0.0],
        ]
    )
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    # stop-gradient decomposition: d l_t / d logp_k = 0 for k < t (the prefix enters detached)
    expected_grad = torch.tensor([[0.0, -math.exp(-0.1), 0.0], [0.0, 0.0, 0.0], [math.exp(0.02), math.exp(0.03), 0.0]])
    torch.testing.assert_close(logps.grad, expected_grad)


def test_cumulative_differs_from_token_ratio():
    # token ratio at t2 would be e^-.2 (PPO); CTPO uses the prefix product e^{.1-.2} = e^-.1
    ctx, _ = ctx_of([[0.1, -0.2]], [1.0])
    loss = ctpo_surrogate(ctx, **{**KW, "ctpo_clip_low": 1.0, "ctpo_clip_high": 1.0})
    torch.testing.assert_close(loss, torch.tensor([[-math.exp(0.1), -math.exp(-0.1)]]))


def test_geomean_mode():
    # L = running mean [.1, -.05, .0667]; power -0.5: window [-.025/√t, .05/√t]
    #   t1: .1 > .05 → -e^.05; t2: -.05 < -.0177 → max(-e^-.05, -e^-.0177) = -e^-.05 (grad -e^-.05);
    #   t3: .0667 > .0289 → -e^{.05/√3}
    ctx, logps = ctx_of([[0.1, -0.2, 0.3]], [1.0])
    loss = ctpo_surrogate(ctx, **{**KW, "ctpo_power": -0.5, "ctpo_ratio_mode": "geomean"})
    torch.testing.assert_close(loss, torch.tensor([[-math.exp(0.05), -math.exp(-0.05), -math.exp(0.05 / S3)]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -math.exp(-0.05), 0.0]]))


def test_log_ratio_cap_10_and_token_clamp_20():
    # power 0, wide window: L = [6, 12] → t2 capped at log ρ = 10 (grad 0); token log-ratio 50 clamps to 20
    wide = {**KW, "ctpo_power": 0.0, "ctpo_clip_low": 100.0, "ctpo_clip_high": 100.0, "ctpo_clip_c": 100.0}
    ctx, logps = ctx_of([[6.0, 6.0], [-50.0, 1.0]], [1.0, 1.0])
    loss = ctpo_surrogate(ctx, **wide)
    torch.testing.assert_close(
        loss, torch.tensor([[-math.exp(6.0), -math.exp(10.0)], [-math.exp(-20.0), -math.exp(-19.0)]])
    )
    loss.sum().backward()
    assert torch.isfinite(logps.grad).all()
    torch.testing.assert_close(logps.grad[0], torch.tensor([-math.exp(6.0), 0.0]))


def test_dual_clip_is_the_upper_bound_with_official_defaults():
    # c = high: for A<0 the loss is -A·exp(clamp(L, -low s, high s)) exactly; A>0 only the upper bound binds
    torch.manual_seed(0)
    lr = 0.1 * torch.randn(6, 9)
    adv = torch.randn(6, 1)
    ctx = ObjectiveContext(lr.clone(), torch.zeros(6, 9), adv, torch.ones(6, 9))
    loss = ctpo_surrogate(ctx, **KW)
    s = torch.arange(1, 10.0).sqrt()
    L = lr.cumsum(-1).clamp(max=10.0)
    neg = -adv * torch.exp(torch.clamp(L, -0.025 * s, 0.05 * s))
    pos = -adv * torch.exp(torch.clamp(L, max=0.05 * s))
    torch.testing.assert_close(loss, torch.where(adv < 0, neg, pos))


def _official(old_log_prob, log_prob, advantages, response_mask, low=0.025, high=0.05, c=0.05, power=0.5):
    """Transcription of horizon-llm/CTPO@acc40211dbea core_algos.py:_compute_policy_loss_cum_token_la_impl
    l.1572-1631 (cumprod branch, per-token pg_losses before aggregation)."""
    nak = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    mask = response_mask.to(nak.dtype)
    cs = torch.cumsum(nak * mask, dim=-1)
    kl = torch.where(mask > 0, cs, torch.zeros_like(cs))
    lir = torch.clamp(kl.detach() + log_prob - log_prob.detach(), max=10.0)
    ratio = torch.where(mask > 0, torch.exp(lir), torch.zeros_like(lir))
    scale = torch.cumsum(mask, dim=-1).clamp(min=1.0).pow(power)
    lrc = torch.clamp(lir, -low * scale, high * scale)
    cr = torch.where(mask > 0, torch.exp(lrc), torch.zeros_like(lrc))
    dct = torch.where(mask > 0, torch.exp(c * scale), torch.ones_like(scale))
    l1 = torch.maximum(-advantages * ratio, -advantages * cr)
    l2 = torch.min(-advantages * dct, l1)
    return torch.where(advantages < 0, l2, l1)


@pytest.mark.parametrize("adv_shape", [(5, 1), (5, 8)])
def test_matches_official_formula_values_and_gradients(adv_shape):
    torch.manual_seed(1)
    old = -torch.rand(5, 8) * 3
    cur = old + 0.08 * torch.randn(5, 8)
    adv = torch.randn(*adv_shape)
    mask = (torch.rand(5, 8) > 0.2).float()
    mask[0] = 0.0  # empty completion
    a, b = cur.clone().requires_grad_(), cur.clone().requires_grad_()
    ours = ctpo_surrogate(ObjectiveContext(a, old, adv, mask), **KW)
    ref = _official(old, b, adv, mask)
    torch.testing.assert_close(ours * mask, ref * mask)
    (ours * mask).sum().backward()
    (ref * mask).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
    assert (ours[0] == 0).all() and (a.grad[0] == 0).all()


def test_on_policy_is_grpo_surrogate():
    torch.manual_seed(2)
    adv = torch.randn(4, 1)
    mask = torch.ones(4, 6)
    logps = -torch.rand(4, 6)
    a, b = logps.clone().requires_grad_(), logps.clone().requires_grad_()
    la = ctpo_surrogate(ObjectiveContext(a, logps, adv, mask), **KW)
    lb = clipped_surrogate(
        ObjectiveContext(b, logps, adv, mask),
        epsilon=0.2,
        epsilon_high=None,
        delta=None,
        importance_sampling_level="token",
    )
    torch.testing.assert_close(la, lb)
    la.sum().backward()
    lb.sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_padding_and_masked_tokens_are_not_read():
    # mask [1, 0, 1]: the masked token's log-ratio 5 neither enters L nor advances t → t3 is position 2, L = .03
    ctx, logps = ctx_of([[0.02, 5.0, 0.01]], [-1.0], mask=[[1.0, 0.0, 1.0]])
    loss = ctpo_surrogate(ctx, **KW)
    torch.testing.assert_close(loss, torch.tensor([[math.exp(0.02), 0.0, math.exp(0.03)]]))
    total = aggregate(loss, ctx.mask, "global_token_mean", global_num_tokens=2.0)
    total.backward()
    assert logps.grad[0, 1].item() == 0.0
    torch.testing.assert_close(total, torch.tensor((math.exp(0.02) + math.exp(0.03)) / 2))


def test_flags_and_validation():
    v = get_variant("ctpo")
    assert v.flags["loss_type"] == "ctpo" and v.flags["loss_aggregation"] == "global_token_mean"
    assert (v.flags["ctpo_clip_low"], v.flags["ctpo_clip_high"], v.flags["ctpo_clip_c"], v.flags["ctpo_power"]) == (
        0.025,
        0.05,
        0.05,
        0.5,
    )
    assert v.params == ("ctpo_clip_low", "ctpo_clip_high", "ctpo_clip_c", "ctpo_power", "ctpo_ratio_mode")
    common = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False}
    GRPOConfig(**common, **v.flags)
    for flag, bad in (
        ("ctpo_clip_low", 0.0),
        ("ctpo_clip_high", -1.0),
        ("ctpo_clip_c", float("nan")),
        ("ctpo_power", float("inf")),
        ("ctpo_ratio_mode", "sequence"),
    ):
        with pytest.raises(ValueError, match=flag):
            GRPOConfig(**common, loss_type="ctpo", **{flag: bad})
    with pytest.raises(ValueError, match="ctpo_ratio_mode"):
        ctx, _ = ctx_of([[0.0]], [1.0])
        ctpo_surrogate(ctx, **{**KW, "ctpo_ratio_mode": "bad"})
