"""GPG (`loss_type="gpg"`): REINFORCE surrogate `-A·logp`, hand-derived values and gradients."""

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, reinforce_surrogate

# Fixture: two rollouts of one group with rewards [1, 0] → GPG advantages r - mean = [0.5, -0.5] (no std).
LOGPS = [[-1.0, -0.5, -2.0], [-0.3, -2.5, -7.0]]
OLD = [[-1.5, -0.6, -1.9], [-0.9, -1.9, -1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]  # row 1: last position is padding
ADV = [0.5, -0.5]


def ctx_of(logps, old, adv, mask):
    logps = torch.tensor(logps, requires_grad=True)
    adv = torch.tensor(adv)
    adv = adv.view(-1, 1) if adv.dim() == 1 else adv
    return ObjectiveContext(logps, torch.tensor(old), adv, torch.tensor(mask)), logps


def test_flags_are_the_papers():
    v = get_variant("gpg")
    assert v.flags == {"loss_type": "gpg", "scale_rewards": "none", "beta": 0.0,
                       "loss_aggregation": "global_token_mean"}
    assert v.official_code.startswith("AMAP-ML/GPG@e096da8ce527a1636272469cee383ba71ec4a511")
    config = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **v.flags)
    assert config.beta == 0.0 and config.scale_rewards == "none"


def test_hand_values_and_gradient():
    # l = -A·logp: row 0 (A=.5): [.5, .25, 1.0]; row 1 (A=-.5): [-.15, -1.25, (pad) -3.5]
    ctx, logps = ctx_of(LOGPS, OLD, ADV, MASK)
    per_token = reinforce_surrogate(ctx)
    torch.testing.assert_close(per_token, torch.tensor([[0.5, 0.25, 1.0], [-0.15, -1.25, -3.5]]))
    # global_token_mean over the 5 real tokens: (.5+.25+1.0-.15-1.25)/5 = .35/5 = .07 (padding not read)
    loss = aggregate(per_token, ctx.mask, "global_token_mean", global_num_tokens=5.0)
    assert loss.item() == pytest.approx(0.07)
    loss.backward()
    # dL/dlogp_t = -A_i/5 on real tokens, 0 on padding; independent of the rollout log-probs
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.1, -0.1, -0.1], [0.1, 0.1, 0.0]]))


def test_official_micro_batch_token_mean():
    # official compute_loss l.303: (Σ l·m) / Σ m on the micro-batch = token_mean here, same .07 for one micro-batch
    ctx, _ = ctx_of(LOGPS, OLD, ADV, MASK)
    assert aggregate(reinforce_surrogate(ctx), ctx.mask, "token_mean").item() == pytest.approx(0.07)


def test_old_logps_are_never_read():
    # no ratio: changing the rollout log-probs changes neither loss nor gradient
    ctx_a, la = ctx_of(LOGPS, OLD, ADV, MASK)
    ctx_b, lb = ctx_of(LOGPS, [[9.0, -9.0, 0.0], [3.0, 3.0, 3.0]], ADV, MASK)
    for ctx in (ctx_a, ctx_b):
        aggregate(reinforce_surrogate(ctx), ctx.mask, "global_token_mean", global_num_tokens=5.0).backward()
    torch.testing.assert_close(la.grad, lb.grad)


def test_on_policy_gradient_equals_grpo_and_off_policy_does_not():
    # at ρ = 1, d/dlogp[-A·ρ] = -A·ρ = -A: same gradient as the clipped surrogate
    grads = []
    for fn in (reinforce_surrogate, lambda c: clipped_surrogate(
            c, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token")):
        ctx, logps = ctx_of(LOGPS, LOGPS, ADV, MASK)
        aggregate(fn(ctx), ctx.mask, "global_token_mean", global_num_tokens=5.0).backward()
        grads.append(logps.grad)
    torch.testing.assert_close(grads[0], grads[1])
    # off-policy, GRPO weights by ρ (or clips to 0) while GPG keeps -A/5: row 0 token 0 has ρ = e^.5 > 1.2 → 0
    ctx, logps = ctx_of(LOGPS, OLD, ADV, MASK)
    aggregate(clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token"),
              ctx.mask, "global_token_mean", global_num_tokens=5.0).backward()
    assert logps.grad[0, 0].item() == 0.0


def test_token_advantages_zero_advantage_and_empty_completion():
    # (B, T) advantages act token by token; A = 0 and an all-padding row give no loss and no gradient
    ctx, logps = ctx_of([[-1.0, -2.0], [-0.5, -0.5], [-3.0, -1.0]], [[0.0, 0.0]] * 3,
                        [[1.0, -2.0], [0.0, 0.0], [4.0, 4.0]], [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    per_token = reinforce_surrogate(ctx)
    torch.testing.assert_close(per_token[0], torch.tensor([1.0, -4.0]))  # -1·(-1), -(-2)·(-2)
    assert torch.isfinite(per_token).all()
    aggregate(per_token, ctx.mask, "global_token_mean", global_num_tokens=4.0).backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.25, 0.5], [0.0, 0.0], [0.0, 0.0]]))
