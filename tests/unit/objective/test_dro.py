"""DRO's per-token loss and gradient on hand-computed tensors (verl's CPU-test fixture), and its config refusals."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, dro_surrogate

# verl's fixture (tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py): the third token is padding
OLD = torch.tensor([[-1.0, -0.7, -0.2]])
NEW = torch.tensor([[-0.8, -0.9, -0.1]])
ADV = torch.tensor([[2.0, -1.5, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def _ctx(logps, old=OLD, adv=ADV, mask=MASK):
    return ObjectiveContext(logps, old, adv, mask, torch.zeros_like(logps))


def test_loss_and_gradient_by_hand():
    logps = NEW.clone().requires_grad_(True)
    loss = dro_surrogate(_ctx(logps), dro_beta=0.05)
    # token 1: log-ratio 0.2  -> -(2·(-0.8) - 0.025·0.04) = 1.601;  token 2: -0.2 -> -(-1.5·(-0.9) - 0.001) = -1.349
    torch.testing.assert_close(loss[0, :2], torch.tensor([1.601, -1.349]))
    # verl's token-mean over the two real tokens: (1.601 - 1.349) / 2 = 0.126
    total = aggregate(loss, MASK, "global_token_mean", global_num_tokens=MASK.sum())
    torch.testing.assert_close(total, torch.tensor(0.126))
    total.backward()
    # dl/dlogp = (-A + β·log-ratio) / 2 tokens: (-2 + 0.01) / 2, (1.5 - 0.01) / 2, padding 0
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.995, 0.745, 0.0]]))


def test_on_policy_gradient_is_reinforce():
    # logp = logp_old: the penalty and its gradient vanish, dl/dlogp = -A (GRPO's at ratio 1)
    logps = OLD.clone().requires_grad_(True)
    dro_surrogate(_ctx(logps), dro_beta=10.0).sum().backward()
    torch.testing.assert_close(logps.grad, -ADV)


def test_penalty_is_symmetric_in_the_log_ratio_and_scales_with_beta():
    adv = torch.zeros(1, 2)
    old = torch.zeros(1, 2)
    loss = dro_surrogate(_ctx(torch.tensor([[0.3, -0.3]]), old=old, adv=adv, mask=torch.ones(1, 2)), dro_beta=2.0)
    torch.testing.assert_close(loss, torch.tensor([[0.09, 0.09]]))  # β/2 · 0.3² = 0.09 either way


def test_sequence_level_advantages_broadcast():
    # A (B, 1) = 2 on every token, β = 1: l = -2·logp + ½ (logp - old)²
    loss = dro_surrogate(_ctx(NEW, adv=torch.tensor([[2.0]])), dro_beta=1.0)
    torch.testing.assert_close(loss, -2.0 * NEW + 0.5 * (NEW - OLD) ** 2)


def _config(**kw):
    return trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, loss_type="dro", **kw)


@pytest.mark.parametrize("beta", [None, 0.0, -0.1, math.nan, math.inf, True])
def test_bad_beta_fails_at_construction(beta):
    with pytest.raises(ValueError, match="dro_beta"):
        _config(dro_beta=beta)


def test_beta_without_the_loss_is_refused():
    with pytest.raises(ValueError, match="dro_beta=0.05 belongs to variant 'dro'"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, dro_beta=0.05)


def test_registered_with_verls_source():
    variant = trl_groupx.get_variant("dro")
    assert variant.stage == "objective" and variant.flags["dro_beta"] == 0.05
    assert "compute_policy_loss_dro" in variant.official_code
