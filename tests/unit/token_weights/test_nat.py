"""NAT Horvitz–Thompson token subsampling: inclusion probabilities by hand, unbiasedness by averaging over seeds.

Inclusion probabilities (0-based real position s, real length L):
- URS, q = 0.5: π = 0.5 on every real token → kept tokens get A / 0.5 = 2A.
- RPC, K uniform on {K_min, …, L}, K_min = max(1, ⌈c·L⌉), π_s = 1 for s < K_min else (L − s)/(L − K_min + 1):
  c = 0,   L = 4: K_min = 1, span 4 → π = [1, 3/4, 2/4, 1/4]
  c = 0.5, L = 4: K_min = 2, span 3 → π = [1, 1, 2/3, 1/3]
  c = 0.5, L = 3: K_min = ⌈1.5⌉ = 2, span 2 → π = [1, 1, 1/2]
  any c,   L = 1: K_min = 1, span 1 → π = [1]
"""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import nat_token_advantages
from trl_groupx.token_weights.nat import inclusion_probabilities, nat_generator, sample_keep

MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
A = torch.tensor([1.0, -2.0, 0.5, 3.0])
R = torch.tensor([1.0, 0.0, 0.5, 1.0])


def run(advantages=A, mask=MASK, rewards=R, group_size=4, scheme="urs", q=0.5, c=0.0, seed=0, step=0):
    ctx = TokenContext(mask, group_size, rewards=rewards)
    return nat_token_advantages(advantages, ctx, nat_scheme=scheme, nat_keep_prob=q, nat_rpc_min_fraction=c,
                                seed=seed, global_step=step)


def test_inclusion_probabilities_by_hand():
    m4, m3, m1 = torch.tensor([[1, 1, 1, 1]]), torch.tensor([[1, 1, 1, 0]]), torch.tensor([[1, 0, 0, 0]])
    pi = lambda m, s, q=0.5, c=0.0: inclusion_probabilities(m, s, q, c).float()  # noqa: E731
    torch.testing.assert_close(pi(m4, "urs"), torch.full((1, 4), 0.5))
    torch.testing.assert_close(pi(m3, "urs"), torch.tensor([[0.5, 0.5, 0.5, 1.0]]))  # padding: 1, never used
    torch.testing.assert_close(pi(m4, "rpc"), torch.tensor([[1, 0.75, 0.5, 0.25]]))
    torch.testing.assert_close(pi(m4, "rpc", c=0.5), torch.tensor([[1, 1, 2 / 3, 1 / 3]]))
    torch.testing.assert_close(pi(m3, "rpc", c=0.5), torch.tensor([[1, 1, 0.5, 1]]))
    torch.testing.assert_close(pi(m1, "rpc", c=0.5), torch.tensor([[1.0, 1, 1, 1]]))


def test_urs_hand_values_kept_tokens_get_a_over_q():
    out = run(scheme="urs", q=0.5)
    keep = sample_keep(MASK, "urs", 0.5, 0.0, nat_generator(0, 0))
    expected = torch.where(keep, 2 * A[:, None].expand(4, 4), torch.zeros(4, 4))
    torch.testing.assert_close(out, expected)
    assert keep.any() and (keep.sum() < MASK.sum())  # some but not all real tokens were dropped at this seed


def test_rpc_keeps_a_prefix_weighted_by_inverse_survival():
    mask = torch.ones(1, 4, dtype=torch.long)
    for step in range(20):
        out = run(advantages=torch.tensor([1.0]), mask=mask, rewards=None, group_size=1, scheme="rpc", step=step)[0]
        kept = (out != 0).long()
        k = int(kept.sum())
        assert k >= 1 and kept[:k].all()  # a prefix, at least one token
        torch.testing.assert_close(out[:k], torch.tensor([1, 4 / 3, 2, 4])[:k])  # 1 / [1, 3/4, 2/4, 1/4]


def test_keep_everything_is_grpo():
    broadcast = torch.where(MASK.bool(), A[:, None].expand(4, 4), torch.zeros(4, 4))
    torch.testing.assert_close(run(scheme="urs", q=1.0), broadcast)
    torch.testing.assert_close(run(scheme="rpc", c=1.0), broadcast)


@pytest.mark.parametrize("scheme,q,c", [("urs", 0.5, 0.0), ("urs", 0.2, 0.0), ("rpc", 0.5, 0.0), ("rpc", 1.0, 0.5)])
def test_empirical_inclusion_frequency_matches_pi(scheme, q, c):
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]])
    draws = torch.stack([sample_keep(mask, scheme, q, c, nat_generator(1, s)) for s in range(4000)]).double()
    pi = inclusion_probabilities(mask, scheme, q, c)
    freq = draws.mean(0)
    se = (pi * (1 - pi) / 4000).sqrt()
    assert ((freq - pi).abs()[mask.bool()] <= 5 * se[mask.bool()] + 1e-12).all()
    assert (draws[:, ~mask.bool()] == 0).all()  # padding never selected


@pytest.mark.parametrize("scheme,q,c", [("urs", 0.5, 0.0), ("rpc", 1.0, 0.0), ("rpc", 1.0, 0.5)])
def test_expected_gradient_equals_full_gradient(scheme, q, c):
    """Hand-built problem: free logits θ (N, T, V), a clipped surrogate at ratio ≠ 1 (so the clip is active on
    some tokens), token-mean normaliser over the completion mask. Averaging the NAT gradient over 3000 seeds
    recovers the full-token gradient (each entry within 5 standard errors)."""
    torch.manual_seed(0)
    n, t, v = 4, 5, 3
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]).float()
    ids = torch.randint(0, v, (n, t))
    theta0 = torch.randn(n, t, v)
    old_logps = torch.log_softmax(theta0 + 0.3 * torch.randn(n, t, v), -1).gather(-1, ids[..., None])[..., 0]
    adv_seq = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def grad(token_adv):
        theta = theta0.clone().requires_grad_()
        logps = torch.log_softmax(theta, -1).gather(-1, ids[..., None])[..., 0]
        ratio = torch.exp(logps - old_logps)
        per_token = -torch.min(ratio * token_adv, torch.clamp(ratio, 0.8, 1.2) * token_adv)
        ((per_token * mask).sum() / mask.sum()).backward()
        return theta.grad

    full = grad(adv_seq[:, None].expand(n, t))
    samples = torch.stack([
        grad(nat_token_advantages(adv_seq, TokenContext(mask, 4), nat_scheme=scheme, nat_keep_prob=q,
                                  nat_rpc_min_fraction=c, seed=7, global_step=s))
        for s in range(3000)
    ])
    mean, se = samples.mean(0), samples.std(0) / 3000**0.5
    assert ((mean - full).abs() <= 5 * se + 1e-7).all()
    assert (mean - full).norm() < 0.05 * full.norm()
    assert samples.std(0).max() > 0  # the estimator is random, not the full gradient in disguise


def test_randomness_from_seed_and_step_only():
    state = torch.random.get_rng_state()
    a = run(scheme="urs", seed=3, step=5)
    torch.manual_seed(123)  # the global RNG plays no role
    b = run(scheme="urs", seed=3, step=5)
    torch.testing.assert_close(a, b)
    assert not torch.equal(run(scheme="urs", seed=3, step=6), a) or not torch.equal(run(scheme="urs", seed=4, step=5), a)
    torch.random.set_rng_state(state)
    before = torch.random.get_rng_state()
    run(scheme="rpc", seed=3, step=5)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is not consumed


def test_rpc_padding_width_never_read():
    # extra padding columns (another process padded wider) leave the real tokens' weights unchanged under RPC
    wide = torch.cat([MASK, torch.zeros(4, 3, dtype=MASK.dtype)], 1)
    a, b = run(scheme="rpc", step=2), run(mask=wide, scheme="rpc", step=2)
    torch.testing.assert_close(b[:, :4], a)
    assert (b[:, 4:] == 0).all()


def test_padding_is_zero_and_empty_completion_gets_nothing():
    for scheme in ("urs", "rpc"):
        for step in range(10):
            out = run(scheme=scheme, step=step)
            assert (out[MASK == 0] == 0).all() and torch.isfinite(out).all()
            assert (out[3] == 0).all()  # empty completion


def test_nan_reward_gets_zero_and_inf_is_an_error():
    out = run(rewards=torch.tensor([1.0, float("nan"), 0.5, 1.0]), q=1.0)
    assert (out[1] == 0).all()
    out = run(advantages=torch.tensor([1.0, float("nan"), 0.5, 3.0]), rewards=None, q=1.0)
    assert (out[1] == 0).all()
    with pytest.raises(ValueError, match="token_weighting='nat'.*inf"):
        run(rewards=torch.tensor([1.0, float("inf"), 0.5, 1.0]))


def test_all_equal_groups_and_small_groups():
    assert (run(advantages=torch.zeros(4)) == 0).all()  # all-equal group → A = 0 → nothing to weight
    for g in (1, 2):
        out = run(group_size=g, q=1.0)
        torch.testing.assert_close(out, torch.where(MASK.bool(), A[:, None].expand(4, 4), torch.zeros(4, 4)))
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_truncated_completion_full_width():
    mask = torch.ones(2, 4, dtype=torch.long)  # no EOS: every position real
    out = run(advantages=torch.tensor([1.0, -1.0]), mask=mask, rewards=None, group_size=2, scheme="rpc", step=1)
    assert out[:, 0].abs().eq(1).all()  # the first token is always kept (K ≥ 1) with π = 1


def test_validation():
    base = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="nat")
    GRPOConfig(**base, nat_scheme="rpc", nat_rpc_min_fraction=0.25)
    with pytest.raises(ValueError, match="nat_scheme"):
        GRPOConfig(**base, nat_scheme="topk")
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="nat_keep_prob"):
            GRPOConfig(**base, nat_keep_prob=bad)
    with pytest.raises(ValueError, match="nat_rpc_min_fraction"):
        GRPOConfig(**base, nat_rpc_min_fraction=-0.1)
    with pytest.raises(ValueError, match="gmpo"):
        GRPOConfig(**base, loss_type="gmpo")
