"""HölderPO (`loss_type="holderpo"`): Hölder-mean sequence ratio with a sequence-level PPO clip and a linear p
schedule — hand-derived values and gradients, the p = 1 / p → 0 / p = −1 special cases, the schedule, edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, gmpo_surrogate, holderpo_p, holderpo_surrogate

SCHED = {"holderpo_p_start": 2.0, "holderpo_p_end": -2.0, "holderpo_schedule_steps": 500}


def kw(p=None, step=0, **over):
    """Surrogate kwargs; `p` given → constant schedule at that p."""
    out = dict(epsilon=0.2, epsilon_high=None, **SCHED, holderpo_schedule="linear", global_step=step, total_steps=10)
    if p is not None:
        out.update(holderpo_p_start=p, holderpo_schedule="constant")
    out.update(over)
    return out


def ctx_of(ratios, adv, mask=None):
    """One row per list of token ratios, old log-probs 0 (so logp = log ρ), (B, 1) advantages."""
    logps = torch.tensor([[math.log(r) for r in row] for row in ratios], requires_grad=True)
    m = torch.ones_like(logps) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return ObjectiveContext(logps, torch.zeros_like(logps), torch.tensor(adv).view(-1, 1), m), logps


def loss_and_grad(ctx, logps, **k):
    per_token = holderpo_surrogate(ctx, **k)
    loss = aggregate(per_token, ctx.mask, "sequence_mean")
    loss.backward()
    return per_token.detach(), loss.detach(), logps.grad.clone()


def test_registered_with_schedule_inputs_and_paper_defaults():
    v = get_variant("holderpo")
    assert v.stage == "objective" and v.requires == ("global_step",)
    assert v.flags["holderpo_p_start"] == 2.0 and v.flags["holderpo_p_end"] == -2.0
    assert v.flags["holderpo_schedule_steps"] == 500 and v.flags["epsilon"] == 0.2
    assert v.flags["loss_aggregation"] == "sequence_mean"
    cfg = GRPOConfig(output_dir="/tmp/holderpo_cfg", loss_type="holderpo", report_to="none", use_cpu=True)
    assert (cfg.holderpo_p_start, cfg.holderpo_p_end, cfg.holderpo_schedule_steps) == (2.0, -2.0, 500)


def test_p1_arithmetic_mean_hand_values_and_gradient():
    # ρ = [1.5, 0.7], A = 1, p = 1: M = (1.5 + 0.7)/2 = 1.1 ∈ [0.8, 1.2] → ℓ = −1.1;
    # dℓ/dlog ρ_t = −A ρ_t / |y| = [−0.75, −0.35]
    ctx, logps = ctx_of([[1.5, 0.7]], [1.0])
    per_token, loss, grad = loss_and_grad(ctx, logps, **kw(p=1.0))
    torch.testing.assert_close(per_token, torch.full((1, 2), -1.1))
    torch.testing.assert_close(loss, torch.tensor(-1.1))
    torch.testing.assert_close(grad, torch.tensor([[-0.75, -0.35]]))
    # GRPO (token clip, then per-sequence mean) clips token 0 (1.5 > 1.2): (−1.2 − 0.7)/2 = −0.95, grad [0, −0.35]
    logps2 = logps.detach().clone().requires_grad_()
    ctx2 = ObjectiveContext(logps2, ctx.old_logps, ctx.advantages, ctx.mask)
    grpo = aggregate(clipped_surrogate(ctx2, epsilon=0.2, epsilon_high=None, delta=None,
                                       importance_sampling_level="token"), ctx2.mask, "sequence_mean")
    grpo.backward()
    torch.testing.assert_close(grpo.detach(), torch.tensor(-0.95))
    torch.testing.assert_close(logps2.grad, torch.tensor([[0.0, -0.35]]))


def test_p1_equals_grpo_sequence_mean_when_no_clip_is_active():
    # Derivation: with p = 1, −A·M_1 = mean_t(−A ρ_t), GRPO's per-sequence token mean, whenever no token ratio and
    # no sequence mean leaves [1 − ε, 1 + ε]; same value and same gradient −A ρ_t / |y|.
    torch.manual_seed(0)
    log_r = (0.15 * torch.rand(3, 5) - 0.075)  # ρ ∈ [0.93, 1.08]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([[0.7], [-1.3], [0.4]])
    grads = []
    for fn in ("holder", "grpo"):
        logps = log_r.clone().requires_grad_()
        ctx = ObjectiveContext(logps, torch.zeros(3, 5), adv, mask)
        per_token = (holderpo_surrogate(ctx, **kw(p=1.0)) if fn == "holder" else
                     clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None,
                                       importance_sampling_level="token"))
        loss = aggregate(per_token, mask, "sequence_mean")
        loss.backward()
        grads.append((loss.detach(), logps.grad * mask))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_p0_geometric_mean_hand_values_and_gradient():
    # ρ = [2, 0.5], A = 1, p = 0: M = exp((log 2 − log 2)/2) = 1 → ℓ = −1; dM/dlog ρ_t = M/|y| = 0.5 → grad −0.5
    ctx, logps = ctx_of([[2.0, 0.5]], [1.0])
    per_token, _, grad = loss_and_grad(ctx, logps, **kw(p=0.0))
    torch.testing.assert_close(per_token, torch.full((1, 2), -1.0))
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5]]))


def test_p_to_0_equals_gmpo_without_its_token_clip():
    # Derivation: with |p| < 1e-6 the ratio is GMPO's exp(mean log ρ); GMPO with an infinite log-space clip has no
    # token clip, and where M stays in [0.8, 1.2] HölderPO's sequence clip is inactive too: same value and gradient.
    torch.manual_seed(1)
    log_r = 0.6 * torch.rand(4, 6) - 0.3  # token ratios up to e^{±0.3}: some leave [0.8, 1.2]
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    adv = torch.tensor([[1.0], [-0.5], [2.0], [-1.5]])
    out = []
    for fn in ("holder", "gmpo"):
        logps = log_r.clone().requires_grad_()
        ctx = ObjectiveContext(logps, torch.zeros(4, 6), adv, mask)
        per_token = holderpo_surrogate(ctx, **kw(p=0.0)) if fn == "holder" else gmpo_surrogate(ctx, gmpo_clip=1e9)
        loss = aggregate(per_token, mask, "sequence_mean")
        loss.backward()
        out.append((loss.detach(), logps.grad * mask))
    seq_mean = (log_r * mask).sum(-1) / mask.sum(-1)
    assert (seq_mean.exp() > 0.8).all() and (seq_mean.exp() < 1.2).all()  # the sequence clip is inactive
    torch.testing.assert_close(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1])
    # continuity: p = 1e-4 (power-mean branch) is within 1e-4 of the geometric mean (catalog check)
    ctx, _ = ctx_of([[1.15, 0.9, 1.05, 0.95]], [1.0])
    near = holderpo_surrogate(ctx, **kw(p=1e-4))[0, 0].item()
    at0 = holderpo_surrogate(ctx, **kw(p=0.0))[0, 0].item()
    assert near == pytest.approx(at0, abs=1e-4) and near != at0


def test_p_minus_1_harmonic_mean_hand_values_and_gradient():
    # ρ = [1.25, 1], A = 1, p = −1: mean(1/ρ) = (0.8 + 1)/2 = 0.9 → M = 1/0.9 = 1.1111 (unclipped) → ℓ = −1.1111;
    # dM/dlog ρ_t = M^{1−p} ρ_t^p / |y| = M² / (2 ρ_t) = [1.234568·0.8/2, 1.234568/2] = [0.493827, 0.617284]
    ctx, logps = ctx_of([[1.25, 1.0]], [1.0])
    per_token, _, grad = loss_and_grad(ctx, logps, **kw(p=-1.0))
    torch.testing.assert_close(per_token, torch.full((1, 2), -1 / 0.9))
    m = 1 / 0.9
    torch.testing.assert_close(grad, torch.tensor([[-m * m * 0.8 / 2, -m * m / 2]]))


def test_p2_quadratic_mean_hand_values_and_gradient():
    # ρ = [1, 0.6], A = 1, p = 2: M = sqrt((1 + 0.36)/2) = sqrt(0.68) = 0.824621 → ℓ = −0.824621;
    # dM/dlog ρ_t = M^{−1} ρ_t² / 2 = [0.606339, 0.218282]
    ctx, logps = ctx_of([[1.0, 0.6]], [1.0])
    per_token, _, grad = loss_and_grad(ctx, logps, **kw(p=2.0))
    m = math.sqrt(0.68)
    torch.testing.assert_close(per_token, torch.full((1, 2), -m))
    torch.testing.assert_close(grad, torch.tensor([[-1 / m / 2, -0.36 / m / 2]]))


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, -1.0, -2.0])
def test_sequence_clip(p):
    # all ρ = 2 → M = 2 for every p.  A = +1: max(−2, −1.2) = −1.2, clipped, grad 0.
    # A = −1: max(2, 1.2) = 2, unclipped, dM/dlog ρ_t = 2^{1−p} 2^p / 2 = 1 → grad +1.
    # all ρ = 0.5, A = −1: max(0.5, 0.8) = 0.8, clipped, grad 0.   A = +1: max(−0.5, −0.8) = −0.5, grad −0.25.
    ctx, logps = ctx_of([[2.0, 2.0], [2.0, 2.0], [0.5, 0.5], [0.5, 0.5]], [1.0, -1.0, -1.0, 1.0])
    per_token = holderpo_surrogate(ctx, **kw(p=p))
    torch.testing.assert_close(per_token[:, 0], torch.tensor([-1.2, 2.0, 0.8, -0.5]))
    per_token[:, 0].sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [-0.25, -0.25]]))


def test_on_policy_gradient_is_grpo_for_every_p():
    # ρ = 1 → M = 1 and dM/dlog ρ_t = 1/|y| for every p: gradient −A/|y| per token
    for p in (2.0, 0.5, 0.0, -2.0):
        ctx, logps = ctx_of([[1.0, 1.0, 1.0, 1.0]], [0.8])
        holderpo_surrogate(ctx, **kw(p=p))[:, 0].sum().backward()
        torch.testing.assert_close(logps.grad, torch.full((1, 4), -0.2))


def test_schedule_values():
    # linear from 2 to −2 over 500 steps: p(step) = 2 − 4·min(1, step/500)
    s = {"p_start": 2.0, "p_end": -2.0, "schedule_steps": 500}
    assert holderpo_p(0, **s) == 2.0
    assert holderpo_p(125, **s) == 1.0
    assert holderpo_p(250, **s) == 0.0  # midpoint: geometric mean
    assert holderpo_p(500, **s) == -2.0
    assert holderpo_p(1000, **s) == -2.0  # held after the schedule
    assert holderpo_p(-3, **s) == 2.0  # clamped at 0 (official)
    assert holderpo_p(400, **s, schedule="constant") == 2.0
    assert holderpo_p(7, p_start=0.5, p_end=0.5, schedule_steps=10) == 0.5


def test_schedule_reaches_the_surrogate_through_global_step():
    # ρ = [1.25, 1], A = 1: step 0 → p = 2: M = sqrt((1.5625 + 1)/2) = 1.131923; step 250 → p = 0: M = sqrt(1.25)
    # = 1.118034; step 750 → p = −2: M = (mean(ρ^{−2}))^{−1/2} = (0.82)^{−1/2} = 1.104315
    ctx, _ = ctx_of([[1.25, 1.0]], [1.0])
    for step, m in [(0, math.sqrt(1.28125)), (250, math.sqrt(1.25)), (750, 0.82 ** -0.5)]:
        torch.testing.assert_close(holderpo_surrogate(ctx, **kw(step=step))[0, 0], torch.tensor(-m))


def test_empty_completion_and_padding_never_read():
    # row 1 has no completion token: M = 1 and no gradient; NaN/huge values at padding do not leak
    logps = torch.tensor([[math.log(1.1), math.log(0.9), float("nan")], [float("nan"), 50.0, float("inf")]],
                         requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    ctx = ObjectiveContext(logps, torch.zeros(2, 3), torch.tensor([[1.0], [-1.0]]), mask)
    for p in (2.0, 0.0, -2.0):
        logps.grad = None
        per_token = holderpo_surrogate(ctx, **kw(p=p))
        assert torch.isfinite(per_token).all()
        torch.testing.assert_close(per_token[1], torch.ones(3))  # −A·1
        loss = aggregate(per_token, mask, "sequence_mean")
        loss.backward()
        assert torch.isfinite(logps.grad).all() and (logps.grad[1] == 0).all() and logps.grad[0, 2] == 0
    # a truncated (full-length) row is just a row: same as the unpadded row
    ctx_full, _ = ctx_of([[1.1, 0.9]], [1.0])
    torch.testing.assert_close(holderpo_surrogate(ctx, **kw(p=2.0))[0, :2],
                               holderpo_surrogate(ctx_full, **kw(p=2.0))[0])


def test_large_log_ratios_do_not_overflow():
    # Δ = [50, 0], p = 2: the official Σ exp(p·Δ) = e^100 + 1 overflows float32 (max 3.4e38), but
    # M = (e^100/2 + 1/2)^{1/2} = exp(50 − log(2)/2) = 3.6611e21 is finite. A = −1: ℓ = max(M, 1.2) = M (unclipped);
    # dM/dlog ρ_t = M^{1−p} ρ_t^p / |y| = [e^100/(2M), 1/(2M)] = [M, 1/(2M)] since M² = e^100/2 (+1/2)
    logps = torch.tensor([[50.0, 0.0]], requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(1, 2), torch.tensor([[-1.0]]), torch.ones(1, 2))
    per_token = holderpo_surrogate(ctx, **kw(p=2.0))
    m = math.exp(50 - math.log(2) / 2)
    assert per_token[0, 0].item() == pytest.approx(m, rel=1e-5)
    per_token[0, 0].backward()
    assert logps.grad[0, 0].item() == pytest.approx(m, rel=1e-5)
    assert 0 <= logps.grad[0, 1].item() < 1e-20


def test_token_advantages_are_averaged():
    # (1, T) token advantages [1, 3] → A = 2: ρ = [1, 1] → ℓ = −2
    ctx, _ = ctx_of([[1.0, 1.0]], [0.0])
    ctx = ObjectiveContext(ctx.logps, ctx.old_logps, torch.tensor([[1.0, 3.0]]), ctx.mask)
    torch.testing.assert_close(holderpo_surrogate(ctx, **kw(p=-1.0)), torch.full((1, 2), -2.0))


@pytest.mark.parametrize("bad, match", [
    ({"holderpo_schedule": "cos"}, "holderpo_schedule"),
    ({"holderpo_schedule_steps": 0}, "holderpo_schedule_steps"),
    ({"holderpo_p_end": float("inf")}, "holderpo_p_end"),
    ({"epsilon": 1.5}, "epsilon"),
])
def test_bad_values_name_the_flag(bad, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir="/tmp/holderpo_cfg", loss_type="holderpo", report_to="none", use_cpu=True, **bad)


def test_constant_schedule_allows_any_length():
    cfg = GRPOConfig(output_dir="/tmp/holderpo_cfg", loss_type="holderpo", report_to="none", use_cpu=True,
                     holderpo_schedule="constant", holderpo_p_start=1.0, holderpo_schedule_steps=0)
    assert cfg.holderpo_schedule == "constant"
