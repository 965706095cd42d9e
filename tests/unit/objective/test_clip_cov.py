"""Clip-Cov (`loss_type="clip_cov"`): PPO clip plus a gradient cut on random high-covariance tokens."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clip_cov_surrogate, clipped_surrogate

# 2 rollouts × 2 tokens, A = [2, -2] → mean A = 0; logp = [[0, -3], [-1, -2]] → mean logp = -1.5
# cov = (A - 0)(logp + 1.5) = [[2·1.5, 2·(-1.5)], [-2·.5, -2·(-.5)]] = [[3, -3], [-1, 1]]
# window (1, 5) strictly → only token (0, 0) (cov 1 is not > 1).
LOGPS = [[0.0, -3.0], [-1.0, -2.0]]
ADV = [[2.0], [-2.0]]
KW = dict(epsilon=0.2, epsilon_high=None, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0)


def ctx_of(logps, old, adv, mask=None):
    logps = torch.tensor(logps, requires_grad=True)
    mask = torch.ones_like(logps) if mask is None else torch.tensor(mask)
    return ObjectiveContext(logps, torch.tensor(old), torch.tensor(adv), mask), logps


def test_hand_values_and_gradient():
    # on-policy ρ = 1: PPO loss -A = [[-2, -2], [2, 2]]; max(1, ⌊2e-4·4⌋) = 1 token cut, the only candidate (0, 0)
    ctx, logps = ctx_of(LOGPS, LOGPS, ADV)
    loss = clip_cov_surrogate(ctx, **KW)
    torch.testing.assert_close(loss, torch.tensor([[0.0, -2.0], [2.0, 2.0]]))
    loss.sum().backward()
    # d(-Aρ)/dlogp = -Aρ = -A on kept tokens, 0 on the cut one
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -2.0], [2.0, 2.0]]))


def test_ppo_clipped_tokens_are_not_candidates():
    # token (0, 0) now has ρ = e^.5 > 1.2 with A > 0 → already clipped by PPO → excluded; no other candidate
    old = [[-0.5, -3.0], [-1.0, -2.0]]
    ctx, _ = ctx_of(LOGPS, old, ADV)
    ppo = clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token")
    torch.testing.assert_close(clip_cov_surrogate(ctx, **KW), ppo)
    assert clip_cov_surrogate(ctx, **KW)[0, 0].item() == pytest.approx(-2.4)  # -A·1.2


def test_number_cut_is_ratio_of_tokens_and_draw_is_seeded():
    # wide window: all 4 tokens are candidates; r = .5 → ⌊.5·4⌋ = 2 tokens cut, chosen by the seeded generator
    kw = {**KW, "clip_cov_ratio": 0.5, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}
    cuts = []
    for _ in range(2):
        torch.manual_seed(3)
        ctx, _ = ctx_of(LOGPS, LOGPS, ADV)
        cuts.append(clip_cov_surrogate(ctx, **kw) == 0)
    assert cuts[0].sum() == 2 and torch.equal(cuts[0], cuts[1])


def test_padding_never_selected_nor_read():
    # the padded position has a huge covariance-making logp; it must not be cut (cut count would then be wasted)
    mask = [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    logps = [[0.0, -3.0, 50.0], [-1.0, -2.0, 50.0]]
    ctx, g = ctx_of(logps, logps, ADV, mask)
    loss = clip_cov_surrogate(ctx, **KW)
    # means over real tokens only: same covariances as the unpadded case → (0, 0) is cut, as above
    torch.testing.assert_close(loss[:, :2], torch.tensor([[0.0, -2.0], [2.0, 2.0]]))
    aggregate(loss, ctx.mask, "global_token_mean", global_num_tokens=4.0).backward()
    torch.testing.assert_close(g.grad, torch.tensor([[0.0, -0.5, 0.0], [0.5, 0.5, 0.0]]))


def test_empty_window_is_ppo_with_grads():
    torch.manual_seed(0)
    lp, old, adv = -torch.rand(3, 5), -torch.rand(3, 5), torch.randn(3, 1)
    a = ObjectiveContext(lp.clone().requires_grad_(), old, adv, torch.ones(3, 5))
    b = ObjectiveContext(lp.clone().requires_grad_(), old, adv, torch.ones(3, 5))
    la = clip_cov_surrogate(a, epsilon=1.0, epsilon_high=1.0, clip_cov_ratio=2e-4, clip_cov_lb=1e8, clip_cov_ub=1e9)
    lb = clipped_surrogate(b, epsilon=1.0, epsilon_high=1.0, delta=None, importance_sampling_level="token")
    torch.testing.assert_close(la, lb)
    la.sum().backward()
    lb.sum().backward()
    torch.testing.assert_close(a.logps.grad, b.logps.grad)


def test_flags_and_validation():
    v = get_variant("clip_cov")
    assert v.flags["epsilon"] == 1.0 and v.flags["epsilon_high"] == 1.0  # official scripts: clip_ratio 1/1
    assert (v.flags["clip_cov_ratio"], v.flags["clip_cov_lb"], v.flags["clip_cov_ub"]) == (2e-4, 1.0, 5.0)
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    GRPOConfig(**common, **v.flags)
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        GRPOConfig(**common, loss_type="clip_cov", clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="clip_cov_lb"):
        GRPOConfig(**common, loss_type="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0)
    assert math.isfinite(v.flags["clip_cov_ub"])
