"""2-GRPO (GRPO with G = 2): the catalog's checks, the DPO-style pair direction, the config guard, edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import group_normalized_advantages, two_grpo_advantages

NAN, INF = float("nan"), float("inf")
BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
M = 0.5 / (math.sqrt(0.5) + 1e-4)  # pair [1, 0]: (d/2)/(|d|/√2 + 1e-4) with d = 1


def two(r, g=2):
    return two_grpo_advantages(torch.tensor(r, dtype=torch.float32), g)


def test_catalog_pairs():
    # [1,0] → equal and opposite ±M; [1,1] → 0; [0,1] → ∓M
    torch.testing.assert_close(two([1, 0, 1, 1, 0, 1]), torch.tensor([M, -M, 0, 0, -M, M]))


def test_margin_only_enters_through_eps():
    # [0.9, 0.1]: d = .8 → (.4)/(.8/√2 + 1e-4) ≈ 1/√2 like [1, 0]: a pure preference sign
    a = two([0.9, 0.1])
    m = 0.4 / (0.8 / math.sqrt(2) + 1e-4)
    torch.testing.assert_close(a, torch.tensor([m, -m]))
    assert abs(a[0].item() - 1 / math.sqrt(2)) < 1e-3


def test_equals_trl_grpo_bit_exactly():
    torch.manual_seed(0)
    r = torch.rand(16)
    r[3] = NAN
    assert torch.equal(two_grpo_advantages(r, 2), group_normalized_advantages(r, 2))


def test_pair_gradient_is_dpo_direction():
    # surrogate −Σ A_i·s_i with s_i the sequence log-likelihood (ratio 1, on-policy): the gradient is
    # −M·(∇s(y⁺) − ∇s(y⁻)), the direction that raises the preferred and lowers the rejected rollout (DPO-style)
    theta = torch.randn(5, requires_grad=True)
    feats = torch.randn(2, 5)
    logp = torch.log_softmax(feats @ theta.unsqueeze(1), dim=0).squeeze(1)  # s(y⁺), s(y⁻)
    adv = two([1, 0])
    (-(adv * logp).sum()).backward()
    g_pair = theta.grad.clone()
    theta.grad = None
    logp = torch.log_softmax(feats @ theta.unsqueeze(1), dim=0).squeeze(1)
    (-(logp[0] - logp[1])).backward()
    torch.testing.assert_close(g_pair, M * theta.grad)


def test_all_equal_nan_and_group_size_one():
    assert torch.equal(two([0.3, 0.3]), torch.zeros(2))
    assert torch.equal(two([1, NAN, 0, 1]), torch.tensor([0.0, 0.0, -M, M]))  # one scored member: std of one → 0
    assert torch.equal(two([1, 0], g=1), torch.zeros(2))


@pytest.mark.parametrize("bad", [INF, -INF])
def test_infinite_reward_names_the_flag(bad):
    with pytest.raises(ValueError, match="advantage_estimator='two_grpo'.*infinite"):
        two([1.0, bad])


def test_config_requires_two_generations():
    GRPOConfig(**BASE, advantage_estimator="two_grpo", num_generations=2)
    with pytest.raises(ValueError, match="two_grpo.*num_generations=2"):
        GRPOConfig(**BASE, advantage_estimator="two_grpo", num_generations=4)
    with pytest.raises(ValueError, match="num_generations_eval"):
        GRPOConfig(**BASE, advantage_estimator="two_grpo", num_generations=2, num_generations_eval=4)
