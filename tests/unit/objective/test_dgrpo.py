"""dGRPO (`loss_type="dgrpo"`): GRPO's clipped surrogate + λ · sampled reverse KL to a teacher (policy-gradient form);
hand-derived values and gradients, the teacher = student and λ = 0 reductions, padding, config errors."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, dgrpo_surrogate
from trl_groupx.objective.dgrpo import sampled_reverse_kl

KW = dict(epsilon=0.2, epsilon_high=None)


def grpo(ctx):
    return clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token")


def fixture(old_shift=0.0):
    """Two rows of three tokens, the second with one padding token; A = (+1, −0.5); teacher log-probs chosen so that
    k1 = logp − logp^T = (0.5, −0.2, 1.0 | 0.3, 0.1, pad)."""
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.8, -1.5], [-1.0, -1.3, float("nan")]])  # NaN at the padding position
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0], [-0.5]])
    ctx = ObjectiveContext(logps, logps.detach() - old_shift, adv, mask, teacher_logps=teacher)
    return ctx, logps


def test_on_policy_values_and_gradients_by_hand():
    # on-policy ρ = 1 (nothing clipped): GRPO term −A, distillation term −min(ρ(−k1), clip(ρ)(−k1)) = k1 in value,
    # d/dlogp of both: −A and +k1 (ρ' = ρ = 1). With λ = 2:
    #   row 0 (A = 1):    l = −1 + 2·(0.5, −0.2, 1.0)   = (0.0, −1.4, 1.0);   grad = (−1 + 1.0, −1 − 0.4, −1 + 2.0)
    #   row 1 (A = −0.5): l = 0.5 + 2·(0.3, 0.1, 0 pad) = (1.1, 0.7, 0.5);    grad = (0.5 + 0.6, 0.5 + 0.2, ·)
    ctx, logps = fixture()
    loss = dgrpo_surrogate(ctx, **KW, opd_coef=2.0)
    torch.testing.assert_close(loss, torch.tensor([[0.0, -1.4, 1.0], [1.1, 0.7, 0.5]]))
    (loss * ctx.mask).sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -1.4, 1.0], [1.1, 0.7, 0.0]]))
    # aggregated as the run aggregates (sequence mean): row means 0.0 + (−1.4) + 1.0 = −0.4 → −0.4/3; (1.1 + 0.7)/2
    total = aggregate(loss.detach(), ctx.mask, "sequence_mean")
    torch.testing.assert_close(total, torch.tensor((-0.4 / 3 + 1.8 / 2) / 2))


def test_off_policy_distillation_term_is_clipped_like_grpo():
    # one token, k1 = 0.5 > 0 so the distillation advantage is −0.5 (< 0): clip bounds [0.8, 1.2]
    #   ρ = 1.5: −min(1.5·(−0.5), 1.2·(−0.5)) = 0.75, unclipped → grad d(0.5ρ)/dlogp = 0.5ρ = 0.75
    #   ρ = 0.5: −min(0.5·(−0.5), 0.8·(−0.5)) = 0.40, clipped    → grad 0
    for ratio, value, grad in ((1.5, 0.75, 0.75), (0.5, 0.40, 0.0)):
        logps = torch.tensor([[-1.0]], requires_grad=True)
        ctx = ObjectiveContext(logps, torch.tensor([[-1.0 - math.log(ratio)]]), torch.zeros(1, 1), torch.ones(1, 1),
                               teacher_logps=torch.tensor([[-1.5]]))
        loss = dgrpo_surrogate(ctx, **KW, opd_coef=1.0)
        torch.testing.assert_close(loss, torch.tensor([[value]]))
        loss.sum().backward()
        torch.testing.assert_close(logps.grad, torch.tensor([[grad]]))


def test_teacher_equal_to_student_gives_grpo_exactly():
    ctx, logps = fixture(old_shift=0.3)  # off-policy too: ρ = e^0.3 (clipped where A > 0)
    ctx.teacher_logps = logps.detach().clone()
    loss = dgrpo_surrogate(ctx, **KW, opd_coef=5.0)
    reference = grpo(ctx)
    assert torch.equal(loss, reference)
    (g_loss,) = torch.autograd.grad((loss * ctx.mask).sum(), logps)
    (g_ref,) = torch.autograd.grad((reference * ctx.mask).sum(), logps)
    assert torch.equal(g_loss, g_ref)


def test_zero_coefficient_is_grpo_with_or_without_teacher():
    ctx, _ = fixture(old_shift=0.1)
    assert torch.equal(dgrpo_surrogate(ctx, **KW, opd_coef=0.0), grpo(ctx))
    ctx.teacher_logps = None
    assert torch.equal(dgrpo_surrogate(ctx, **KW, opd_coef=0.0), grpo(ctx))


def test_a_different_teacher_changes_value_and_gradient():
    ctx, logps = fixture()
    (g_dgrpo,) = torch.autograd.grad((dgrpo_surrogate(ctx, **KW, opd_coef=1.0) * ctx.mask).sum(), logps)
    (g_grpo,) = torch.autograd.grad((grpo(ctx) * ctx.mask).sum(), logps)
    # the difference is exactly λ·k1 on the real tokens (on-policy), 0 on padding
    torch.testing.assert_close(g_dgrpo - g_grpo, torch.tensor([[0.5, -0.2, 1.0], [0.3, 0.1, 0.0]]))


def test_all_equal_group_leaves_only_the_distillation_term():
    # A = 0 everywhere (an all-equal group): GRPO gives no gradient, the teacher still does
    ctx, logps = fixture()
    ctx.advantages = torch.zeros(2, 1)
    loss = dgrpo_surrogate(ctx, **KW, opd_coef=1.0)
    torch.testing.assert_close(loss * ctx.mask, torch.tensor([[0.5, -0.2, 1.0], [0.3, 0.1, 0.0]]))


def test_padding_is_never_read():
    # NaN (or any value) in the teacher's log-probs at padding positions: finite loss, zero gradient there, and the
    # same numbers as with a finite padding value; an empty completion contributes nothing
    ctx, logps = fixture()
    loss = dgrpo_surrogate(ctx, **KW, opd_coef=1.0)
    assert torch.isfinite(loss).all()
    other = ObjectiveContext(ctx.logps, ctx.old_logps, ctx.advantages, ctx.mask,
                             teacher_logps=torch.nan_to_num(ctx.teacher_logps, nan=123.0))
    assert torch.equal(loss, dgrpo_surrogate(other, **KW, opd_coef=1.0))
    (loss * ctx.mask).sum().backward()
    assert logps.grad[1, 2] == 0
    assert torch.equal(sampled_reverse_kl(logps.detach(), ctx.teacher_logps, torch.zeros(2, 3)), torch.zeros(2, 3))


def test_missing_teacher_logps_with_positive_coefficient_is_a_clear_error():
    ctx, _ = fixture()
    ctx.teacher_logps = None
    with pytest.raises(ValueError, match="opd_teacher_model"):
        dgrpo_surrogate(ctx, **KW, opd_coef=1.0)


def test_registration():
    variant = get_variant("dgrpo")
    assert variant.stage == "objective" and variant.requires == ("teacher_logps",)
    assert variant.params == ("opd_teacher_model", "opd_coef") and variant.flags["opd_coef"] == 1.0


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), True, "1"])
def test_bad_coefficient_fails_at_config(value):
    with pytest.raises(ValueError, match="opd_coef"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, loss_type="dgrpo", opd_coef=value)


def test_bad_teacher_and_orphan_flags_fail_at_config():
    with pytest.raises(ValueError, match="opd_teacher_model"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, loss_type="dgrpo", opd_teacher_model=" ")
    with pytest.raises(ValueError, match="opd_teacher_model.*belongs to variant 'dgrpo'"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, opd_teacher_model="some/teacher")
    with pytest.raises(ValueError, match="opd_coef.*belongs to variant 'dgrpo'"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, opd_coef=0.5)
    # without a teacher the config itself is valid (the trainer refuses it when opd_coef > 0)
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, loss_type="dgrpo")
