"""EDGE-GRPO Entropy-Driven Advantage, hand-derived.

Group 0 (G=4, T=3), incoming advantages A = [1, 1, −1, −1]; padding holds junk entropy 100:

| row | mask  | H             | P_i (masked mean) |
|  0  | 1 1 1 | 1 2 3         | 2                 |
|  1  | 1 1 0 | 0.5 1.5 (100) | 1                 |
|  2  | 1 1 1 | 2 2 2         | 2                 |
|  3  | 1 0 0 | 4 (100) (100) | 4                 |

P̄ = (2 + 1 + 2 + 4)/4 = 2.25 → A' = A·P̄/P = [1.125, 2.25, −1.125, −0.5625].
Group 1: all-equal rewards (A = 0) → 0 whatever the entropies.
"""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import edge_grpo_token_advantages

NAN = float("nan")
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]] * 2)
H = torch.tensor([[1, 2, 3], [0.5, 1.5, 100], [2, 2, 2], [4, 100, 100]] * 2)
A = torch.tensor([1.0, 1.0, -1.0, -1.0, 0, 0, 0, 0])
R = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])


def run(advantages=A, rewards=R, mask=MASK, entropies=H, group_size=4, eps=1e-6):
    ctx = TokenContext(mask, group_size, entropies=entropies, logps=-entropies, rewards=rewards)
    return edge_grpo_token_advantages(advantages, ctx, edge_grpo_eps=eps)


def seq(values, mask=MASK):
    return torch.tensor(values)[:, None] * mask


def test_hand_values():
    torch.testing.assert_close(run(), seq([1.125, 2.25, -1.125, -0.5625, 0, 0, 0, 0]))


def test_padding_never_leaks():
    other = H.clone()
    other[~MASK.bool()] = 1e9
    torch.testing.assert_close(run(entropies=other), run())
    assert (run()[~MASK.bool()] == 0).all()


def test_official_formula_without_padding():
    # official (grpo_aha_trainer.py l.1233, micro-batch = one group): A / H.mean(1) * H.mean(1).mean(0);
    # with no padding the masked and unmasked means agree, so the numbers must be identical.
    mask = torch.ones(4, 5)
    h = torch.rand(4, 5, generator=torch.Generator().manual_seed(0)) + 0.1
    adv = torch.tensor([1.2, -0.3, 0.5, -1.4])
    official = adv / h.mean(1) * h.mean(1).mean(0)
    torch.testing.assert_close(run(adv, torch.ones(4), mask, h)[:, 0], official)


def test_equal_entropies_give_grpo():
    h = torch.full((8, 3), 0.7)
    torch.testing.assert_close(run(entropies=h), A[:, None] * MASK)


def test_same_reward_different_entropy_gives_different_advantage():
    out = run()
    assert out[0, 0] != out[1, 0] and out[0, 0] > 0 and out[1, 0] > 0


def test_nan_reward_excluded_from_group_mean():
    rewards, adv = R.clone(), A.clone()
    rewards[3], adv[3] = NAN, NAN
    # P̄ = (2 + 1 + 2)/3 = 5/3
    torch.testing.assert_close(run(adv, rewards)[:4], seq([5 / 6, 5 / 3, -5 / 6, 0], MASK[:4]))


def test_empty_completion_excluded_from_group_mean():
    mask = MASK.clone()
    mask[1] = 0
    # P̄ = (2 + 2 + 4)/3 = 8/3
    torch.testing.assert_close(run(mask=mask)[:4], seq([4 / 3, 0, -4 / 3, -2 / 3], mask[:4]))


def test_inf_reward_is_a_clear_error():
    rewards = R.clone()
    rewards[0] = float("inf")
    with pytest.raises(ValueError, match="token_weighting='edge_grpo'.*inf"):
        run(rewards=rewards)


def test_group_sizes():
    assert torch.equal(run(torch.zeros(8), group_size=1), torch.zeros(8, 3))  # G = 1: TRL gives A = 0
    torch.testing.assert_close(run(group_size=1), A[:, None] * MASK)  # each its own mean: P̄ = P_i
    # G = 2: (0,1): P̄ = 1.5 → [0.75, 1.5]; (2,3): P̄ = 3 → [−1.5, −0.75]
    torch.testing.assert_close(run(group_size=2)[:4], seq([0.75, 1.5, -1.5, -0.75], MASK[:4]))
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_zero_entropy_stays_finite():
    h = H.clone()
    h[0] = 0.0  # P_0 = 0 → divided by eps
    out = run(entropies=h)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 0], torch.tensor(1.75 / 1e-6))  # P̄ = (0 + 1 + 2 + 4)/4


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="edge_grpo")
    GRPOConfig(**base)
    with pytest.raises(ValueError, match="edge_grpo_eps must be > 0"):
        GRPOConfig(**base, edge_grpo_eps=0.0)
