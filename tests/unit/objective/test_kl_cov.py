"""KL-Cov (`loss_type="kl_cov"`): unclipped PG plus `|log ρ|` on the top-covariance tokens."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import kl_cov_surrogate

# same batch as test_clip_cov: cov = [[3, -3], [-1, 1]] → top-1 is token (0, 0)
LOGPS = [[0.0, -3.0], [-1.0, -2.0]]
ADV = [[2.0], [-2.0]]
SHIFT = [[0.1, 0.2], [0.3, -0.4]]  # log ρ = logp - old


def ctx_of(logps, old, adv, mask=None):
    logps = torch.tensor(logps, requires_grad=True)
    mask = torch.ones_like(logps) if mask is None else torch.tensor(mask)
    return ObjectiveContext(logps, torch.tensor(old), torch.tensor(adv), mask), logps


def test_hand_values_and_gradient():
    old = [[lp - s for lp, s in zip(r, sr)] for r, sr in zip(LOGPS, SHIFT)]
    ctx, logps = ctx_of(LOGPS, old, ADV)
    # k = max(1, ⌊.25·4⌋) = 1 → token (0, 0) gets + 1·|.1|; everything else -Aρ (no clipping)
    loss = kl_cov_surrogate(ctx, kl_cov_ratio=0.25, kl_cov_coef=1.0)
    e = math.exp
    expected = [[-2 * e(0.1) + 0.1, -2 * e(0.2)], [2 * e(0.3), 2 * e(-0.4)]]
    torch.testing.assert_close(loss, torch.tensor(expected))
    loss.sum().backward()
    # d/dlogp: -Aρ, plus β·sign(log ρ) = +1 on the penalised token
    torch.testing.assert_close(logps.grad, torch.tensor([[-2 * e(0.1) + 1, -2 * e(0.2)], [2 * e(0.3), 2 * e(-0.4)]]))


def test_on_policy_penalty_and_its_gradient_vanish():
    ctx, logps = ctx_of(LOGPS, LOGPS, ADV)
    loss = kl_cov_surrogate(ctx, kl_cov_ratio=1.0, kl_cov_coef=5.0)  # every token penalised
    torch.testing.assert_close(loss, torch.tensor([[-2.0, -2.0], [2.0, 2.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-2.0, -2.0], [2.0, 2.0]]))  # GRPO's -A


def test_no_clipping_far_off_policy():
    # ρ = e^2 with A > 0 is clipped to 1.2 by PPO; KL-Cov keeps -Aρ on unselected tokens
    ctx, logps = ctx_of([[0.0, -1.0]], [[-2.0, -1.0]], [[1.0]])
    loss = kl_cov_surrogate(ctx, kl_cov_ratio=1e-4, kl_cov_coef=1.0)
    # one row → A constant → cov 0 for both tokens; k = 1 token gets the |log ρ| penalty (token 1's is |0| = 0)
    assert loss[0, 1].item() == pytest.approx(-1.0)
    assert loss[0, 0].item() in (pytest.approx(-math.exp(2.0) + 2.0), pytest.approx(-math.exp(2.0)))
    assert loss[0, 0].item() < -1.2 * 1.0 - 4  # far beyond PPO's clipped -1.2: no clipping


def test_padding_never_selected_nor_read():
    # padded position (0, 1): old log-prob -200 would give ρ = e^200 = inf in float32; it is neither selected
    # (k = 3 real tokens → all three penalised, not the padding) nor turned into a NaN gradient
    mask = [[1.0, 0.0], [1.0, 1.0]]
    ctx, logps = ctx_of([[0.0, -1.0], [-1.0, -2.0]], [[-0.5, -200.0], [-1.5, -2.5]], ADV, mask)
    loss = kl_cov_surrogate(ctx, kl_cov_ratio=1.0, kl_cov_coef=1.0)
    assert torch.isfinite(loss).all()
    # row 1: A = -2, log ρ = .5 → -Aρ + |.5| = 2e^.5 + .5; row 0 token 0: A = 2, log ρ = .5 → -2e^.5 + .5
    torch.testing.assert_close(loss[1], torch.tensor([2 * math.exp(0.5) + 0.5] * 2))
    assert loss[0, 0].item() == pytest.approx(-2 * math.exp(0.5) + 0.5)
    (loss * ctx.mask).sum().backward()
    assert torch.isfinite(logps.grad).all() and logps.grad[0, 1].item() == 0.0


def test_flags_and_validation():
    v = get_variant("kl_cov")
    assert v.flags["kl_cov_ratio"] == 2e-3 and v.flags["kl_cov_coef"] == 1.0
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    GRPOConfig(**common, **v.flags)
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        GRPOConfig(**common, loss_type="kl_cov", kl_cov_ratio=2.0)
    with pytest.raises(ValueError, match="kl_cov_coef"):
        GRPOConfig(**common, loss_type="kl_cov", kl_cov_coef=-1.0)
