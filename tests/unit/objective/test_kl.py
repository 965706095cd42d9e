"""KL estimators (`kl_estimator`): values and the gradients their loss terms give, by hand."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.objective import KL_ESTIMATORS, per_token_kl
from trl_groupx.objective.kl import kl_coefficient

# log π = [0, -1], log π_ref = [-1, -1] → δ = ref - π = [-1, 0]
LOGPS = [[0.0, -1.0]]
REF = [[-1.0, -1.0]]


@pytest.mark.parametrize(
    "estimator, values, grads",
    [
        # k1 = -δ = [1, 0]; d/dlogπ = 1 everywhere
        ("k1", [1.0, 0.0], [1.0, 1.0]),
        # k2 = δ²/2 = [0.5, 0]; d/dlogπ = -δ = [1, 0]
        ("k2", [0.5, 0.0], [1.0, 0.0]),
        # k3 = e^δ - δ - 1 = [e^-1, 0]; d/dlogπ = 1 - e^δ = [1 - e^-1, 0]
        ("k3", [math.exp(-1.0), 0.0], [1 - math.exp(-1.0), 0.0]),
        # abs = |δ| = [1, 0]; d/dlogπ = sign(-δ) = [1, 0] (torch: sign(0) = 0)
        ("abs", [1.0, 0.0], [1.0, 0.0]),
    ],
)
def test_hand_values_and_gradients(estimator, values, grads):
    logps = torch.tensor(LOGPS, requires_grad=True)
    kl = per_token_kl(logps, torch.tensor(REF), estimator)
    torch.testing.assert_close(kl, torch.tensor([values]))
    kl.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([grads]))


def test_k3_is_trls_expression_bit_for_bit():
    logps, ref = torch.randn(3, 5), torch.randn(3, 5)
    delta = ref - logps
    assert torch.equal(per_token_kl(logps, ref), torch.exp(delta) - delta - 1)


def test_expected_gradients_match_the_kl_they_estimate():
    """On-policy over a 3-symbol softmax: E[∇k1] = 0, E[∇k2] = ∇KL(π‖ref), E[∇k3] = ∇KL(ref‖π) (exact sums)."""
    theta = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.4, -0.1]), -1)

    def expected_grad(estimator):
        logp = torch.log_softmax(theta, -1)
        probs = logp.exp().detach()  # samples y ~ π: weights, not differentiated
        (g,) = torch.autograd.grad((probs * per_token_kl(logp, ref, estimator)).sum(), theta)
        return g

    logp = torch.log_softmax(theta, -1)
    (reverse,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta)
    logp = torch.log_softmax(theta, -1)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)
    torch.testing.assert_close(expected_grad("k1"), torch.zeros(3), atol=1e-7, rtol=0)
    torch.testing.assert_close(expected_grad("k2"), reverse)
    torch.testing.assert_close(expected_grad("k3"), forward)


def test_unknown_estimator():
    with pytest.raises(ValueError, match="kl_estimator='k4' is unknown"):
        per_token_kl(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    assert KL_ESTIMATORS == ("k1", "k2", "k3", "abs")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kl_estimator="k4", beta=0.04), "kl_estimator='k4' is unknown"),
        (dict(kl_estimator="k2", beta=0.0), "no effect with beta=0"),
        (dict(kl_estimator="k2", beta=0.04, loss_type="luspo"), "cannot be combined with loss_type='luspo'"),
        (dict(kl_estimator="k1", beta=0.04, entropy_coef=0.01), "entropy bonus"),
    ],
)
def test_bad_configs(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)


def test_good_configs(tmp_path):
    for loss_type in ("grpo", "dapo", "cispo", "sapo", "gmpo"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, loss_type=loss_type, beta=0.04, kl_estimator="k2")


# ---- beta_negative (MDP-GRPO's asymmetric KL) -------------------------------------------------------------------

def test_kl_coefficient_by_advantage_sign():
    advantages = torch.tensor([[0.5], [-0.2], [0.0]])
    assert kl_coefficient(0.01, None, advantages) == 0.01  # symmetric: TRL's scalar
    # A < 0 → β− = 0.025; A ≥ 0 (zero included, as the official `where(A < 0, …)`) → β+ = 0.01
    torch.testing.assert_close(kl_coefficient(0.01, 0.025, advantages), torch.tensor([[0.01], [0.025], [0.01]]))
    token_adv = torch.tensor([[1.0, -1.0]])  # (B, T) advantages: per token
    torch.testing.assert_close(kl_coefficient(0.1, 0.3, token_adv), torch.tensor([[0.1, 0.3]]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beta_negative=0.025, beta=0.0), r"beta_negative=0.025 has no effect with beta=0"),
        (dict(beta_negative=-0.1, beta=0.01), "beta_negative must be a finite number >= 0"),
        (dict(beta_negative=float("inf"), beta=0.01), "beta_negative must be a finite number >= 0"),
        (dict(beta_negative=0.025, beta=0.01, loss_type="luspo"), "cannot be combined with loss_type='luspo'"),
        (dict(beta_negative=0.025, beta=0.01, entropy_coef=0.01), "unset beta_negative"),
    ],
)
def test_bad_beta_negative(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)


def test_beta_negative_good_configs(tmp_path):
    for loss_type in ("grpo", "dapo", "cispo", "sapo", "gmpo"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, loss_type=loss_type, beta=0.01,
                   beta_negative=0.025)
