"""SRPO (`loss_type="srpo"`): routing of failed rollouts with a correct sibling, entropy weights and the top-k
divergence by hand, the per-token loss of each route and its gradients, edge cases, config errors."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import clipped_surrogate, srpo_surrogate
from trl_groupx.objective.self_teacher import SelfDistillBatch, route
from trl_groupx.objective.srpo import entropy_weights, topk_divergence

KW = dict(epsilon=0.2, epsilon_high=0.2, importance_sampling_level="token", srpo_distill_alpha=0.5,
          srpo_distill_add_tail=True)
NAN = math.nan


def _route(rewards, group_size, threshold=1.0):
    return route(torch.tensor(rewards), group_size, threshold).tolist()


# ---- routing -------------------------------------------------------------------------------------------------------


def test_failed_rollouts_with_a_correct_sibling_are_routed():
    # group 1: two correct, two failed -> the failed ones; group 2: no correct -> none (they stay on GRPO);
    # group 3: all correct -> none
    assert _route([1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1], 4) == [False, True, True, False] + [False] * 8


def test_partial_rewards_below_the_threshold_are_failures():
    # 0.5 (format only) is a failure next to a 1; 1.5 (accuracy + format) is correct
    assert _route([1.5, 0.5, 0.0, 0.99], 4) == [False, True, True, True]
    assert _route([0.6, 0.5], 2, threshold=0.6) == [False, True]


def test_nan_rewards_are_neither_correct_nor_routed():
    assert _route([1, NAN, 0, NAN], 4) == [False, False, True, False]
    assert _route([NAN, NAN], 2) == [False, False]


def test_group_sizes_one_and_two():
    assert _route([0, 1, 1, 0], 1) == [False] * 4  # a rollout alone has no sibling
    assert _route([1, 0, 0, 0, 0, 1], 2) == [False, True, False, False, True, False]


# ---- entropy weights -----------------------------------------------------------------------------------------------


def test_entropy_weights_by_hand():
    # distillation tokens: H = ln 2, 0, ln 4 -> exp(-H) = 1/2, 1, 1/4, mean 7/12 -> weights 6/7, 12/7, 3/7;
    # the padding position holds NaN and a non-distillation row holds entropies: both weigh 0 and are never read
    entropy = torch.tensor([[math.log(2), 0.0, NAN], [math.log(4), 5.0, 5.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    w = entropy_weights(entropy, mask, beta=1.0)
    expected = torch.tensor([[6 / 7, 12 / 7, 0.0], [3 / 7, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected)
    assert w[mask > 0].mean().item() == pytest.approx(1.0)


def test_entropy_weights_beta_and_global_normalisation():
    entropy = torch.tensor([[math.log(2), math.log(4)]])
    mask = torch.ones(1, 2)
    torch.testing.assert_close(entropy_weights(entropy, mask, beta=0.0), torch.ones(1, 2))  # beta 0: uniform
    # beta 2: exp(-2 ln 2) = 1/4, exp(-2 ln 4) = 1/16, mean 5/32 -> 8/5, 2/5
    torch.testing.assert_close(entropy_weights(entropy, mask, beta=2.0), torch.tensor([[8 / 5, 2 / 5]]))
    # normalised by a larger set (other processes' tokens): Σ exp(-H) = 3 over 4 tokens -> exp(-H) * 4/3
    w = entropy_weights(entropy, mask, beta=1.0, total=(torch.tensor(3.0), torch.tensor(4.0)))
    torch.testing.assert_close(w, torch.tensor([[2 / 3, 1 / 3]]))
    # no distillation token: all zeros, no division by zero
    assert torch.equal(entropy_weights(entropy, torch.zeros(1, 2), beta=1.0), torch.zeros(1, 2))


# ---- divergence ----------------------------------------------------------------------------------------------------


def _kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def test_jensen_shannon_on_a_hand_made_distribution():
    # vocabulary of 3, the teacher's top-2 = tokens 0, 1. student (0.5, 0.3, 0.2), teacher (0.6, 0.3, 0.1)
    student = torch.tensor([[[math.log(0.5), math.log(0.3)]]], dtype=torch.float64)
    teacher = torch.tensor([[[math.log(0.6), math.log(0.3)]]], dtype=torch.float64)
    # with the tail bucket the support is (top-2, rest) = the whole vocabulary: the exact JS
    p, q = (0.5, 0.3, 0.2), (0.6, 0.3, 0.1)
    m = [(a + b) / 2 for a, b in zip(p, q)]
    js = 0.5 * _kl(p, m) + 0.5 * _kl(q, m)
    got = topk_divergence(student, teacher, alpha=0.5, add_tail=True)
    assert got.shape == (1, 1) and got.item() == pytest.approx(js, rel=1e-9)
    # without it both are renormalised on the top-2: (5/8, 3/8) and (2/3, 1/3)
    p2, q2 = (5 / 8, 3 / 8), (2 / 3, 1 / 3)
    m2 = [(a + b) / 2 for a, b in zip(p2, q2)]
    got = topk_divergence(student, teacher, alpha=0.5, add_tail=False)
    assert got.item() == pytest.approx(0.5 * _kl(p2, m2) + 0.5 * _kl(q2, m2), rel=1e-9)
    # alpha 1: reverse KL(student || teacher); alpha 0: forward KL(teacher || student)
    assert topk_divergence(student, teacher, alpha=1.0, add_tail=True).item() == pytest.approx(_kl(p, q), rel=1e-9)
    assert topk_divergence(student, teacher, alpha=0.0, add_tail=True).item() == pytest.approx(_kl(q, p), rel=1e-9)


def test_divergence_is_zero_with_zero_gradient_when_student_equals_teacher():
    logps = torch.log(torch.tensor([[[0.4, 0.3, 0.1]]], dtype=torch.float64)).requires_grad_()
    value = topk_divergence(logps, logps.detach().clone(), alpha=0.5, add_tail=True)
    value.sum().backward()
    assert value.item() == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(logps.grad, torch.zeros_like(logps), atol=1e-10, rtol=0)


def test_divergence_gradient_matches_finite_differences():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(2, 3, 4, generator=gen, dtype=torch.float64)
    student = torch.log(0.9 * probs / probs.sum(-1, keepdim=True)).requires_grad_()  # top-k mass 0.9
    teacher = torch.log(0.8 * torch.softmax(torch.randn(2, 3, 4, generator=gen, dtype=torch.float64), -1))
    for add_tail in (True, False):
        assert torch.autograd.gradcheck(lambda s: topk_divergence(s, teacher, alpha=0.5, add_tail=add_tail),
                                        (student,))


# ---- the per-token loss ----------------------------------------------------------------------------------------------


def _ctx(routed, seed=0):
    """Four rows of three tokens, the last token of row 3 padding; advantages non-zero on every row."""
    gen = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(4, 3, generator=gen)).requires_grad_()
    old = logps.detach() - 0.1 * torch.randn(4, 3, generator=gen)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[1.0], [-0.5], [0.7], [-1.2]])
    k = 5
    student = torch.log(0.9 * torch.softmax(torch.randn(4, 3, k, generator=gen), -1)).requires_grad_()
    teacher = torch.log(0.95 * torch.softmax(torch.randn(4, 3, k, generator=gen), -1))
    routed = torch.tensor(routed)
    weights = torch.rand(4, 3, generator=gen) * mask * routed[:, None]
    return ObjectiveContext(logps, old, adv, mask, self_distill=SelfDistillBatch(routed, weights, teacher, student))


def test_each_route_gets_its_own_term_only():
    ctx = _ctx([False, True, False, True])
    loss = srpo_surrogate(ctx, **KW)
    grpo = clipped_surrogate(ctx, epsilon=0.2, epsilon_high=0.2, delta=None, importance_sampling_level="token")
    sd = ctx.self_distill
    distill = sd.weights * topk_divergence(sd.student_topk_logps, sd.teacher_topk_logps, alpha=0.5, add_tail=True)
    # correct / unrouted rows: GRPO's surrogate exactly, no distillation term
    assert torch.equal(loss[[0, 2]], grpo[[0, 2]])
    # routed failed rows: the weighted divergence, no policy-gradient term
    torch.testing.assert_close(loss[[1, 3]], distill[[1, 3]])
    assert (distill[[1, 3]] > 0).any() and (grpo[[1, 3]] != 0).all()  # both terms were there to be dropped

    (loss * ctx.mask).sum().backward()
    g_logps, g_student = ctx.logps.grad, sd.student_topk_logps.grad
    assert torch.equal(g_logps[[1, 3]], torch.zeros(2, 3))  # routed rows: zero PG gradient
    assert (g_logps[[0, 2]] != 0).all()
    assert torch.equal(g_student[[0, 2]], torch.zeros(2, 3, 5))  # correct rows: zero distillation gradient
    assert (g_student[1] != 0).any() and torch.equal(g_student[3, 2], torch.zeros(5))  # padding: no gradient


def test_no_routed_row_is_grpo_exactly():
    grpo_kw = dict(epsilon=0.2, epsilon_high=0.2, delta=None, importance_sampling_level="token")
    ctx = _ctx([False, False, False, False])
    assert torch.equal(srpo_surrogate(ctx, **KW), clipped_surrogate(ctx, **grpo_kw))
    ctx.self_distill = None  # what the trainer passes for a micro-batch without routed rows
    assert torch.equal(srpo_surrogate(ctx, **KW), clipped_surrogate(ctx, **grpo_kw))


def test_zero_weight_tokens_contribute_nothing():
    ctx = _ctx([True, True, True, True])
    ctx.self_distill.weights[:, 1] = 0.0
    loss = srpo_surrogate(ctx, **KW)
    assert torch.equal(loss[:, 1], torch.zeros(4))


def test_non_finite_values_of_unrouted_targets_stay_out_of_the_gradient():
    # unrouted rows carry the trainer's uniform placeholder; even an extreme one must not leak NaN into gradients
    ctx = _ctx([False, True, False, False])
    ctx.self_distill.teacher_topk_logps[0] = -1e4
    loss = srpo_surrogate(ctx, **KW)
    (loss * ctx.mask).sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(ctx.logps.grad).all()
    assert torch.isfinite(ctx.self_distill.student_topk_logps.grad).all()


# ---- registration and config -----------------------------------------------------------------------------------------


def test_registration_and_defaults():
    v = get_variant("srpo")
    assert v.stage == "objective" and v.requires == ("self_teacher_topk",) and v.official_code is None
    assert v.flags == {"loss_type": "srpo", "loss_aggregation": "global_token_mean"}  # the shared token denominator
    config = GRPOConfig(output_dir="/tmp/srpo_defaults", use_cpu=True, loss_type="srpo")
    assert (config.srpo_success_threshold, config.srpo_entropy_beta, config.srpo_distill_topk,
            config.srpo_distill_alpha, config.srpo_distill_add_tail, config.srpo_teacher_kind,
            config.srpo_teacher_update_rate) == (1.0, 1.0, 100, 0.5, True, "ema", 0.05)


@pytest.mark.parametrize("flags, message", [
    ({"srpo_entropy_beta": -1.0}, "srpo_entropy_beta must be a finite number"),
    ({"srpo_entropy_beta": math.inf}, "srpo_entropy_beta must be a finite number"),
    ({"srpo_distill_alpha": 1.5}, "srpo_distill_alpha must be a finite number in \\[0.0, 1.0\\]"),
    ({"srpo_teacher_update_rate": 0.0}, "srpo_teacher_update_rate must be a finite number in \\(0.0"),
    ({"srpo_success_threshold": math.nan}, "srpo_success_threshold must be a finite number"),
    ({"srpo_distill_topk": 0}, "srpo_distill_topk must be a positive integer"),
    ({"srpo_distill_topk": 2.5}, "srpo_distill_topk must be a positive integer"),
    ({"srpo_teacher_kind": "frozen"}, "srpo_teacher_kind must be one of"),
    ({"srpo_distill_add_tail": "yes"}, "srpo_distill_add_tail must be True or False"),
])
def test_bad_flags_fail_at_construction(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, loss_type="srpo", **flags)


def test_hyper_parameters_need_the_loss_type(tmp_path):
    with pytest.raises(ValueError, match="srpo_entropy_beta"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, srpo_entropy_beta=0.5)
