"""Off-policy GRPO (`loss_type="offpolicy_grpo"`): the config check on the sync period, and the clipped surrogate
against the lagged rollout policy with hand-derived values and gradients."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, offpolicy_grpo_surrogate

KW = {"epsilon": 0.2, "epsilon_high": None, "delta": None, "importance_sampling_level": "token"}
E = math.exp

# Fixture: row 0 (A = +1), 3 tokens, log-ratios d = logp − logp_α = [.1, .3, −.2];
#          row 1 (A = −1), 2 tokens + padding, d = [−.3, .1, (pad) 5.0].
OLD = [[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]]
D = [[0.1, 0.3, -0.2], [-0.3, 0.1, 5.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def ctx_of(d=D, adv=(1.0, -1.0), mask=MASK, old=OLD):
    old = torch.tensor(old)
    logps = (old + torch.tensor(d)).requires_grad_()
    return ObjectiveContext(logps, old, torch.tensor(adv).view(-1, 1), torch.tensor(mask)), logps


def config(**kw):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **kw)


def test_flags_are_the_papers_and_validate():
    v = get_variant("offpolicy_grpo")
    assert v.flags["offpolicy_grpo_lag"] == 10 and v.flags["num_iterations"] == 1  # paper: v = 10, i = 1
    c = config(**v.flags)
    assert c.steps_per_generation == 10 and c.offpolicy_grpo_lag == 10
    # lag 3 with 2 accumulation steps per optimizer step: one generation per 6 micro-batches
    assert config(loss_type="offpolicy_grpo", offpolicy_grpo_lag=3, gradient_accumulation_steps=2,
                  steps_per_generation=6).steps_per_generation == 6


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"offpolicy_grpo_lag": 0}, r"offpolicy_grpo_lag=0 must be an integer >= 1"),
        ({"offpolicy_grpo_lag": 2.5, "steps_per_generation": 2}, r"offpolicy_grpo_lag=2.5 must be an integer"),
        ({"offpolicy_grpo_lag": True}, r"offpolicy_grpo_lag=True must be an integer"),
        ({"offpolicy_grpo_lag": 4}, r"set steps_per_generation=4 \(got 1"),  # TRL default spg = GA = 1
        ({"offpolicy_grpo_lag": 2, "gradient_accumulation_steps": 2, "steps_per_generation": 2},
         r"set steps_per_generation=4 \(got 2"),
    ],
)
def test_validate_names_the_flags(kw, match):
    with pytest.raises(ValueError, match=match):
        config(loss_type="offpolicy_grpo", **kw)


def test_lag_is_an_orphan_without_the_variant():
    with pytest.raises(ValueError, match="offpolicy_grpo_lag=3 belongs to variant 'offpolicy_grpo'"):
        config(offpolicy_grpo_lag=3)


def test_hand_values_and_gradient():
    ctx, logps = ctx_of()
    per_token = offpolicy_grpo_surrogate(ctx, **KW)
    # A = +1: l = −min(ρ, clip(ρ, .8, 1.2)) → [−e^.1, −1.2 (clipped), −e^−.2]
    # A = −1: l = max(ρ, clip(ρ, .8, 1.2)) → [.8 (clipped: ρ = e^−.3 = .741 < .8), e^.1, (pad) e^5, finite]
    expected = torch.tensor([[-E(0.1), -1.2, -E(-0.2)], [0.8, E(0.1), E(5.0)]])
    torch.testing.assert_close(per_token, expected)
    # sequence_mean: (row 0 mean + row 1 mean over its 2 real tokens) / 2; padding never read
    loss = aggregate(per_token, ctx.mask, "sequence_mean")
    want = ((-E(0.1) - 1.2 - E(-0.2)) / 3 + (0.8 + E(0.1)) / 2) / 2
    assert loss.item() == pytest.approx(want, abs=1e-6)
    loss.backward()
    # ∂l/∂logp = −A ρ on unclipped tokens (∂ρ/∂logp = ρ), 0 on clipped ones and padding; × 1/(|o_i| · B)
    grad = torch.tensor([[-E(0.1) / 6, 0.0, -E(-0.2) / 6], [0.0, E(0.1) / 4, 0.0]])
    torch.testing.assert_close(logps.grad, grad)


def test_on_policy_gradient_is_plain_policy_gradient():
    # lag 1 (or the first step after a sync): α = π_θ, ρ = 1 → l = −A, ∂l/∂logp = −A (nothing clipped)
    ctx, logps = ctx_of(d=[[0.0] * 3, [0.0] * 3])
    per_token = offpolicy_grpo_surrogate(ctx, **KW)
    torch.testing.assert_close(per_token, torch.tensor([[-1.0] * 3, [1.0] * 3]))
    (per_token * ctx.mask).sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.0] * 3, [1.0, 1.0, 0.0]]))


def test_clip_high_and_token_advantages():
    # ε_high = .5 lets ρ = e^.3 = 1.35 through for A > 0: gradient −A ρ there; (B, T) advantages are used per token
    ctx, logps = ctx_of(adv=(1.0, -1.0))
    ctx = ObjectiveContext(ctx.logps, ctx.old_logps, torch.tensor([[2.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]), ctx.mask)
    per_token = offpolicy_grpo_surrogate(ctx, **{**KW, "epsilon_high": 0.5})
    torch.testing.assert_close(per_token[0], torch.tensor([-2 * E(0.1), -E(0.3), 0.0]))
    (per_token * ctx.mask).sum().backward()
    torch.testing.assert_close(logps.grad[0], torch.tensor([-2 * E(0.1), -E(0.3), 0.0]))


def test_empty_completion_and_all_zero_advantages():
    # an empty completion (mask 0) and A = 0 rows contribute 0 and get 0 gradient
    ctx, logps = ctx_of(adv=(0.0, 0.0), mask=[[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    loss = aggregate(offpolicy_grpo_surrogate(ctx, **KW), ctx.mask, "sequence_mean")
    assert loss.item() == 0.0
    loss.backward()
    assert (logps.grad == 0).all()


def test_loss_scale_independent_of_the_micro_batch_split():
    # sequence_mean on two equal micro-batches, each / 2 (accumulation), equals sequence_mean on the whole batch
    ctx, _ = ctx_of()
    whole = aggregate(offpolicy_grpo_surrogate(ctx, **KW), ctx.mask, "sequence_mean")
    halves = 0.0
    for i in (0, 1):
        part = ObjectiveContext(ctx.logps[i:i + 1], ctx.old_logps[i:i + 1], ctx.advantages[i:i + 1], ctx.mask[i:i + 1])
        halves = halves + aggregate(offpolicy_grpo_surrogate(part, **KW), part.mask, "sequence_mean") / 2
    torch.testing.assert_close(halves, whole)
