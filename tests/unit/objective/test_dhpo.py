"""DHPO (`loss_type="dhpo"`): hybrid token/sequence ratio, branch-specific clipping, averaged mixing — hand-derived
values and gradients, the GRPO / GSPO endpoints (bit-exact), edge cases and validation."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, dhpo_surrogate

KW = {
    "epsilon": 0.2,
    "epsilon_high": None,
    "dhpo_mix_weight": 0.5,
    "dhpo_mix_mean": "arithmetic",
    "dhpo_seq_epsilon": 3e-4,
    "dhpo_seq_epsilon_high": 4e-4,
}


def ctx_of(ratios, adv, mask=None):
    """One row per advantage, old log-probs 0, logp = log r; advantages (B, 1)."""
    logps = torch.tensor([[math.log(r) for r in row] for row in ratios], requires_grad=True)
    mask = torch.ones_like(logps) if mask is None else torch.tensor(mask)
    return ObjectiveContext(logps, torch.zeros_like(logps), torch.tensor(adv).reshape(-1, 1), mask), logps


S = math.sqrt(5 * 0.7)  # GSPO's sequence ratio of token ratios [5, 0.7]: exp(mean log r) = √3.5 = 1.870829


def test_hand_values_and_gradients_arithmetic():
    # token ratios r = [5, 0.7], s = √3.5; clipped r̄ = [1.2, 0.8] (ε .2), s̄ = 1 + 4e-4 (GSPO region)
    # h = .5 r + .5 s = [2.5 + s/2, .35 + s/2];  h̄ = .5 r̄ + .5 s̄ = [.6 + .5002, .4 + .5002] = [1.1002, .9002]
    # A=+1: l = -min(h, h̄) = -h̄ = [-1.1002, -.9002]; every branch clipped → grad 0 (token ratio 5 enters as 1.2)
    # A=-1: l = max(h, h̄) = h; d(Σ_t h_t)/d logp_k = .5 r_k + .5 s·(2 tokens)/(2 tokens) = .5 r_k + .5 s = h_k
    ctx, logps = ctx_of([[5.0, 0.7], [5.0, 0.7]], [1.0, -1.0])
    loss = dhpo_surrogate(ctx, **KW)
    h = [2.5 + S / 2, 0.35 + S / 2]
    torch.testing.assert_close(loss, torch.tensor([[-1.1002, -0.9002], h]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.0], h]))


def test_hand_values_geometric():
    # h = √(r s), h̄ = √(r̄ s̄); A=-1 → max(h, h̄) = [√(5 s), √(.7 s)] (both above √(1.2·1.0004), √(.8·1.0004))
    # A=+1 → -min = -[√(1.2·1.0004), √(.8·1.0004)]; gradient for A=-1: d/dlogp_k Σ_t √(r_t s)
    #   = .5 h_k + Σ_t .5 h_t / 2 = .5 h_k + .25 (h_0 + h_1)
    ctx, logps = ctx_of([[5.0, 0.7], [5.0, 0.7]], [1.0, -1.0])
    loss = dhpo_surrogate(ctx, **{**KW, "dhpo_mix_mean": "geometric"})
    h = [math.sqrt(5 * S), math.sqrt(0.7 * S)]
    torch.testing.assert_close(loss, torch.tensor([[-math.sqrt(1.2 * 1.0004), -math.sqrt(0.8 * 1.0004)], h]))
    loss.sum().backward()
    g = [0.5 * h[0] + 0.25 * (h[0] + h[1]), 0.5 * h[1] + 0.25 * (h[0] + h[1])]
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.0], g]))


def _pair(w, mean="arithmetic"):
    torch.manual_seed(0)
    lr = 0.3 * torch.randn(4, 6)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0.0
    adv = torch.randn(4, 1)
    a, b = lr.clone().requires_grad_(), lr.clone().requires_grad_()
    ours = dhpo_surrogate(
        ObjectiveContext(a, torch.zeros(4, 6), adv, mask), **{**KW, "dhpo_mix_weight": w, "dhpo_mix_mean": mean}
    )
    return a, b, adv, mask, ours


@pytest.mark.parametrize("mean", ["arithmetic", "geometric"])
def test_weight_one_is_grpo_and_zero_is_gspo(mean):
    # catalog check: w = 1 → TRL's token-level clipped surrogate, w = 0 → TRL's sequence-level one (bit-exact for the
    # arithmetic mix; the geometric mix goes through exp/log of the clipped ratio, so equal to rounding)
    for w, level, eps, eps_high in ((1.0, "token", 0.2, None), (0.0, "sequence", 3e-4, 4e-4)):
        a, b, adv, mask, ours = _pair(w, mean)
        ref = clipped_surrogate(
            ObjectiveContext(b, torch.zeros(4, 6), adv, mask),
            epsilon=eps,
            epsilon_high=eps_high,
            delta=None,
            importance_sampling_level=level,
        ).expand_as(ours)
        la = aggregate(ours, mask, "sequence_mean")
        lb = aggregate(ref, mask, "sequence_mean")
        la.backward()
        lb.backward()
        if mean == "arithmetic":
            assert torch.equal(ours, ref) and torch.equal(a.grad, b.grad)
        else:
            torch.testing.assert_close(ours, ref)
            torch.testing.assert_close(a.grad, b.grad)


def test_mid_weight_differs_from_both_endpoints_off_policy():
    _, _, _, _, mid = _pair(0.5)
    _, _, _, _, tok = _pair(1.0)
    _, _, _, _, seq = _pair(0.0)
    assert not torch.allclose(mid, tok) and not torch.allclose(mid, seq)


def test_on_policy_gradient_is_grpo():
    # ρ = s = 1: l_t = -A; per sequence d/dlogp_k (1/T) Σ_t h_t A = A (w + (1-w)) / T — GRPO's gradient
    torch.manual_seed(3)
    logps = -torch.rand(3, 5)
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0.0
    adv = torch.randn(3, 1)
    a, b = logps.clone().requires_grad_(), logps.clone().requires_grad_()
    for mean in ("arithmetic", "geometric"):
        a.grad = b.grad = None
        la = aggregate(
            dhpo_surrogate(ObjectiveContext(a, logps, adv, mask), **{**KW, "dhpo_mix_mean": mean}),
            mask,
            "sequence_mean",
        )
        lb = aggregate(
            clipped_surrogate(
                ObjectiveContext(b, logps, adv, mask),
                epsilon=0.2,
                epsilon_high=None,
                delta=None,
                importance_sampling_level="token",
            ),
            mask,
            "sequence_mean",
        )
        torch.testing.assert_close(la, lb)
        la.backward()
        lb.backward()
        torch.testing.assert_close(a.grad, b.grad)


def test_padding_and_empty_completion_not_read():
    # padded log-ratio 30 must not enter the sequence ratio; an all-padding row gives s = 1 and no gradient
    logps = torch.tensor([[math.log(1.1), 30.0], [5.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    ctx = ObjectiveContext(logps, torch.zeros(2, 2), torch.tensor([[-1.0], [1.0]]), mask)
    loss = dhpo_surrogate(ctx, **KW)
    # row 0: r = s = 1.1 (one token); h = 1.1, h̄ = .5·1.1 + .5·1.0004 → A=-1: max = 1.1
    assert loss[0, 0].item() == pytest.approx(1.1)
    total = aggregate(loss, mask, "sequence_mean")
    total.backward()
    assert logps.grad[0, 1].item() == 0.0 and (logps.grad[1] == 0).all()
    assert torch.isfinite(total)


def test_flags_and_validation():
    v = get_variant("dhpo")
    assert v.flags["dhpo_mix_weight"] == 0.5 and v.flags["loss_aggregation"] == "sequence_mean"
    assert v.params == ("dhpo_mix_weight", "dhpo_mix_mean", "dhpo_seq_epsilon", "dhpo_seq_epsilon_high")
    common = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False}
    GRPOConfig(**common, **v.flags)
    for flag, bad in (
        ("dhpo_mix_weight", 1.5),
        ("dhpo_mix_weight", float("nan")),
        ("dhpo_seq_epsilon", 0.0),
        ("dhpo_seq_epsilon_high", 1.0),
        ("dhpo_mix_mean", "harmonic"),
    ):
        with pytest.raises(ValueError, match=flag):
            GRPOConfig(**common, loss_type="dhpo", **{flag: bad})
