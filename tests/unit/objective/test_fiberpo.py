"""FiberPO (`loss_type="fiberpo"`): trajectory (base) gate with rollback and per-token (fibre) gate — hand-derived
values and gradients, the catalog checks (on-policy = vanilla policy gradient; a token outside the fibre band gets 0
gradient while its siblings keep theirs), the advantage-signed rollback, padding, edge cases and validation."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, fiberpo_surrogate

KW = {"fiberpo_epsilon": 0.05, "fiberpo_c_pos": 0.28, "fiberpo_c_neg": 0.2, "fiberpo_rollback_slope": 1.0}
E = math.exp


def ctx_of(log_ratios, adv, mask=None):
    """Rows of token log-ratios (old log-probs 0, logp = l); advantages (B, 1)."""
    logps = torch.tensor(log_ratios, dtype=torch.float64, requires_grad=True)
    mask = torch.ones_like(logps) if mask is None else torch.tensor(mask, dtype=torch.float64)
    adv = torch.tensor(adv, dtype=torch.float64).reshape(-1, 1)
    return ObjectiveContext(logps, torch.zeros_like(logps), adv, mask), logps


def grads(log_ratios, adv, mask=None, **kw):
    ctx, logps = ctx_of(log_ratios, adv, mask)
    loss = fiberpo_surrogate(ctx, **{**KW, **kw})
    loss.sum().backward()
    return loss.detach(), logps.grad


def test_token_outside_fibre_band_gets_zero_grad_siblings_keep_theirs():
    # l = [.1, .2, .12, -.1], A = +1. Upward tokens {.1, .2, .12}: μ⁺ = .42/3 = .14 ≤ C⁺ (no base gate);
    # residuals -.04, +.06, -.02 → token 1 is outside ε = .05: clipped to .05, ρ_1 = e^{.2 - .01} = e^{.19}, no grad.
    # Downward {-.1}: μ⁻ = .1, residual 0. In-band tokens keep ρ_t = e^{l_t} and the vanilla gradient -A ρ_t.
    loss, g = grads([[0.1, 0.2, 0.12, -0.1]], [1.0])
    torch.testing.assert_close(loss, -torch.tensor([[E(0.1), E(0.19), E(0.12), E(-0.1)]], dtype=torch.float64))
    torch.testing.assert_close(g, -torch.tensor([[E(0.1), 0.0, E(0.12), E(-0.1)]], dtype=torch.float64))
    assert g[0, 1].item() == 0.0


def test_censored_token_gets_zero_grad_inside_rollback_zone_too():
    # l = [.5, .52, .48, .6], A = +1: μ⁺ = 2.1/4 = .525 > C⁺ = .28 (excess .245); residuals -.025, -.005, -.045,
    # +.075 → token 3 censored (ρ_3 = e^{.6 - .025 - 2·.245}, a constant); the in-band tokens read μ⁺ with
    # gradient 1/4 each (the censored token's share is detached): d log ρ_s / d l_t = δ_st - 2/4 for s, t in {0,1,2}.
    # grad_t = -(ρ_t - (2/4) Σ_{s in band} ρ_s) for t in band; 0 for token 3.
    loss, g = grads([[0.5, 0.52, 0.48, 0.6]], [1.0])
    rho = [E(0.5 - 0.49), E(0.52 - 0.49), E(0.48 - 0.49), E(0.6 - 0.025 - 0.49)]
    torch.testing.assert_close(loss, -torch.tensor([rho], dtype=torch.float64))
    total = sum(rho[:3])
    expected = [-(rho[t] - 0.5 * total) for t in range(3)] + [0.0]
    torch.testing.assert_close(g, torch.tensor([expected], dtype=torch.float64))


def test_rollback_reverses_the_trajectory_update_for_positive_advantage():
    # l = [.5, .52, .48], A = +1: μ⁺ = .5, excess .22 → log ρ_t = l_t - 2·.22 (κ = 1): ρ = e^{[.06, .08, .04]}.
    # d log ρ_s / d l_t = δ_st - 2/3 → grad_t = -(ρ_t - (2/3) Σ ρ); Σ_t grad_t = +Σ ρ > 0: gradient descent lowers
    # the log-probs (restorative, slope -κ on the mean direction).
    loss, g = grads([[0.5, 0.52, 0.48]], [1.0])
    rho = [E(0.06), E(0.08), E(0.04)]
    torch.testing.assert_close(loss, -torch.tensor([rho], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([[-(r - 2 / 3 * sum(rho)) for r in rho]], dtype=torch.float64))
    assert g.sum().item() == pytest.approx(sum(rho))


def test_rollback_slope_zero_is_a_flat_clip():
    # κ = 0: log ρ_t = l_t - .22 → d log ρ_s / d l_t = δ_st - 1/3: the mean direction carries no gradient.
    loss, g = grads([[0.5, 0.52, 0.48]], [1.0], fiberpo_rollback_slope=0.0)
    rho = [E(0.28), E(0.30), E(0.26)]
    torch.testing.assert_close(loss, -torch.tensor([rho], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([[-(r - sum(rho) / 3) for r in rho]], dtype=torch.float64))
    assert g.sum().item() == pytest.approx(0.0, abs=1e-12)


def test_rollback_for_negative_advantage_uses_the_downward_budget():
    # l = [-.3, -.32, -.28], A = -1: μ⁻ = .3 > C⁻ = .2 (excess .1) → log ρ_t = l_t + 2·.1: ρ = e^{[-.1, -.12, -.08]};
    # loss = +ρ; d log ρ_s / d l_t = δ_st + 2·d μ⁻/d l_t = δ_st - 2/3 → grad_t = ρ_t - (2/3) Σ ρ, Σ grad = -Σ ρ < 0:
    # gradient descent raises the log-probs back toward the budget.
    loss, g = grads([[-0.3, -0.32, -0.28]], [-1.0])
    rho = [E(-0.1), E(-0.12), E(-0.08)]
    torch.testing.assert_close(loss, torch.tensor([rho], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([[r - 2 / 3 * sum(rho) for r in rho]], dtype=torch.float64))
    assert g.sum().item() == pytest.approx(-sum(rho))


def test_trajectory_gate_is_advantage_signed():
    # The upward excess does not gate A < 0 and the downward excess does not gate A > 0: ρ = r, vanilla gradient.
    loss, g = grads([[0.5, 0.52, 0.48], [-0.3, -0.32, -0.28]], [-1.0, 1.0])
    r = torch.exp(torch.tensor([[0.5, 0.52, 0.48], [-0.3, -0.32, -0.28]], dtype=torch.float64))
    sign = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)
    torch.testing.assert_close(loss, -sign * r)
    torch.testing.assert_close(g, -sign * r)


def test_on_policy_gradient_is_vanilla_policy_gradient():
    # catalog check: all ratios 1 → ρ = 1, per-token gradient -A (∇ log π); equal to TRL's GRPO surrogate (on-policy
    # the vanilla policy gradient), token advantages and padding included
    torch.manual_seed(0)
    logps = -torch.rand(4, 6, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[1, 4:] = 0.0
    mask[3, 1:] = 0.0
    adv = torch.randn(4, 6, dtype=torch.float64)
    a, b = logps.clone().requires_grad_(), logps.clone().requires_grad_()
    ours = fiberpo_surrogate(ObjectiveContext(a, logps, adv, mask), **KW)
    ref = clipped_surrogate(
        ObjectiveContext(b, logps, adv, mask), epsilon=0.2, epsilon_high=None, delta=None,
        importance_sampling_level="token",
    )
    torch.testing.assert_close(ours * mask, ref * mask)
    aggregate(ours, mask, "sequence_mean").backward()
    aggregate(ref, mask, "sequence_mean").backward()
    torch.testing.assert_close(a.grad, b.grad)
    # the vanilla policy gradient itself: d/dlogp_t of mean_i (1/|o_i|) Σ_t -A_it logp_it
    torch.testing.assert_close(a.grad, -adv * mask / mask.sum(-1, keepdim=True) / 4)


def test_inside_both_bands_value_is_the_token_ratio():
    # small off-policy moves (all residuals within ε, means below the budgets): ρ_t = r_t exactly, gradient -A r_t
    loss, g = grads([[0.02, 0.03, -0.01, -0.02]], [0.7])
    r = torch.exp(torch.tensor([[0.02, 0.03, -0.01, -0.02]], dtype=torch.float64))
    torch.testing.assert_close(loss, -0.7 * r)
    torch.testing.assert_close(g, -0.7 * r)


def test_jacobian_is_block_diagonal_over_trajectories():
    # two rows in the rollback zone: the gradient of row 0's loss never reaches row 1's log-probs
    ctx, logps = ctx_of([[0.5, 0.52, 0.48], [0.6, 0.61, 0.59]], [1.0, 1.0])
    loss = fiberpo_surrogate(ctx, **KW)
    loss[0].sum().backward()
    assert (logps.grad[1] == 0).all() and (logps.grad[0] != 0).all()


def test_padding_and_empty_completion_not_read():
    # a padded log-ratio of 30 enters neither the same-sign means nor the loss; an all-padding row is 0 with no grad
    ctx, logps = ctx_of([[0.5, 0.52, 30.0], [5.0, 5.0, 5.0]], [1.0, 1.0], mask=[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    loss = fiberpo_surrogate(ctx, **KW)
    # row 0: μ⁺ = .51, excess .23 → ρ = e^{[.5 - .46, .52 - .46]}
    torch.testing.assert_close(loss[0, :2], -torch.tensor([E(0.04), E(0.06)], dtype=torch.float64))
    assert loss[0, 2].item() == 0.0 and (loss[1] == 0).all()
    aggregate(loss, ctx.mask, "sequence_mean").backward()
    assert logps.grad[0, 2].item() == 0.0 and (logps.grad[1] == 0).all()
    assert torch.isfinite(logps.grad).all()


def test_non_finite_padding_is_not_read():
    # NaN / inf log-probs at padded positions (old and current) leave values and gradients finite and unchanged
    logps = torch.tensor([[0.5, 0.52, float("nan")]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, float("inf")]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss = fiberpo_surrogate(ObjectiveContext(logps, old, torch.ones(1, 1, dtype=torch.float64), mask), **KW)
    loss.sum().backward()
    clean, g = grads([[0.5, 0.52]], [1.0])
    torch.testing.assert_close(loss[:, :2], clean)
    torch.testing.assert_close(logps.grad[:, :2], g)
    assert loss[0, 2].item() == 0.0 and logps.grad[0, 2].item() == 0.0


def test_zero_advantage_and_single_token_rows():
    # A = 0 → loss 0 and no gradient; a one-token row is its own same-sign mean (residual 0, never censored)
    loss, g = grads([[0.9], [0.1]], [0.0, 1.0])
    assert loss[0, 0].item() == 0.0 and g[0, 0].item() == 0.0
    # row 1: μ⁺ = .1 ≤ C⁺ → ρ = e^{.1}
    assert loss[1, 0].item() == pytest.approx(-E(0.1)) and g[1, 0].item() == pytest.approx(-E(0.1))


def test_extreme_log_ratios_stay_finite():
    loss, g = grads([[-80.0, -90.0, 1.0]], [-1.0])
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()


def test_flags_and_validation():
    v = get_variant("fiberpo")
    assert v.flags["loss_type"] == "fiberpo" and v.flags["loss_aggregation"] == "sequence_mean"
    assert v.params == ("fiberpo_epsilon", "fiberpo_c_pos", "fiberpo_c_neg", "fiberpo_rollback_slope")
    common = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False}
    cfg = GRPOConfig(**common, **v.flags)
    assert (cfg.fiberpo_epsilon, cfg.fiberpo_c_pos, cfg.fiberpo_c_neg, cfg.fiberpo_rollback_slope) == (
        0.05, 0.28, 0.2, 1.0,
    )
    for flag, bad in (
        ("fiberpo_epsilon", 0.0),
        ("fiberpo_epsilon", float("nan")),
        ("fiberpo_epsilon", 0.6),  # not below C⁺ + C⁻ = .48
        ("fiberpo_c_pos", -0.1),
        ("fiberpo_c_neg", float("inf")),
        ("fiberpo_rollback_slope", -1.0),
    ):
        with pytest.raises(ValueError, match=flag):
            GRPOConfig(**common, loss_type="fiberpo", **{flag: bad})
