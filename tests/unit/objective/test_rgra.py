"""RGRA (`loss_type="rgra"`): the REINFORCE surrogate with GRPO's advantages, sequence mean and KL."""

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, reinforce_surrogate

LOGPS = [[-1.0, -0.5, -2.0], [-0.3, -2.5, -7.0]]
OLD = [[-1.5, -0.6, -1.9], [-0.9, -1.9, -1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
# group rewards [1, 0]: GRPO z-score (unbiased std .7071, eps 1e-4) ≈ [.7070, -.7070]; use round numbers instead
ADV = [0.5, -0.5]


def ctx_of(logps, old, adv, mask):
    logps = torch.tensor(logps, requires_grad=True)
    return ObjectiveContext(logps, torch.tensor(old), torch.tensor(adv).view(-1, 1), torch.tensor(mask)), logps


def test_flags_keep_grpo_advantages_kl_and_sequence_mean():
    v = get_variant("rgra")
    assert v.fn is get_variant("gpg").fn  # one surrogate, two papers
    assert v.flags == {"loss_type": "rgra", "scale_rewards": "group", "beta": 0.04, "use_bias_correction_kl": False,
                       "loss_aggregation": "sequence_mean"}
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **v.flags)


def test_hand_values_and_gradient_sequence_mean():
    # per token -A·logp: row 0 [.5, .25, 1.0] → mean .583333; row 1 [-.15, -1.25] → mean -.7
    # sequence_mean = (.583333 - .7)/2 = -.0583333
    ctx, logps = ctx_of(LOGPS, OLD, ADV, MASK)
    loss = aggregate(reinforce_surrogate(ctx), ctx.mask, "sequence_mean")
    assert loss.item() == pytest.approx(-0.0583333, abs=1e-6)
    loss.backward()
    # dL/dlogp = -A_i / (N·|o_i|): row 0 -.5/(2·3) = -.083333; row 1 .5/(2·2) = .125; padding 0
    torch.testing.assert_close(logps.grad, torch.tensor([[-1 / 12, -1 / 12, -1 / 12], [0.125, 0.125, 0.0]]))


def test_no_clipping_negative_feedback_kept():
    # a far off-policy negative token (ρ = e^{6}) is clipped to zero gradient in GRPO only if A>0; for A<0 PPO lets
    # it grow with ρ. RGRA's gradient does not depend on ρ at all: -A/(N|o|) for every real token.
    ctx, logps = ctx_of([[0.0, 0.0]], [[-6.0, 6.0]], [-1.0], [[1.0, 1.0]])
    aggregate(reinforce_surrogate(ctx), ctx.mask, "sequence_mean").backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.5, 0.5]]))
    ctx, logps = ctx_of([[0.0, 0.0]], [[-6.0, 6.0]], [-1.0], [[1.0, 1.0]])
    aggregate(clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token"),
              ctx.mask, "sequence_mean").backward()
    # GRPO: token 0 ρ = e^6 → gradient ρ/2 = 201.7; token 1 ρ = e^-6 < .8 → clipped, 0
    assert logps.grad[0, 0].item() == pytest.approx(torch.exp(torch.tensor(6.0)).item() / 2, rel=1e-5)
    assert logps.grad[0, 1].item() == 0.0
