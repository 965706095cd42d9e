"""MDP-GRPO dual-anchor + prospect advantages on hand-derived numbers and every edge case."""

import math

import pytest
import torch

from trl_groupx.advantages import mdp_grpo_advantages

NAN, INF = float("nan"), float("inf")


def md(r, g, **kw):
    return mdp_grpo_advantages(torch.tensor(r, dtype=torch.float64), g, **kw)


def pt(v, beta=0.8, lp=1.25, ln=2.0):
    return (lp if v >= 0 else ln) * math.tanh(beta * v)


def test_hand_values_one_success_in_four():
    # r = [1,0,0,0], G=4, C=1: mean .25, pop std sqrt(.25·.75) = √3/4 → z = [√3, −1/√3 ×3]
    # σ_goal = sqrt(4/(4·1)) = 1, μ_goal = max(.5, .25) = .5 → δ = [.5, −.5 ×3]
    # A = .8·PT(z) + .2·PT(δ), PT(v) = 1.25·tanh(.8v) (v ≥ 0), 2·tanh(.8v) (v < 0)
    s3 = math.sqrt(3)
    exp = [0.8 * pt(s3) + 0.2 * pt(0.5)] + [0.8 * pt(-1 / s3) + 0.2 * pt(-0.5)] * 3
    torch.testing.assert_close(md([1, 0, 0, 0], 4), torch.tensor(exp, dtype=torch.float64))
    # numerically: 0.8·1.25·tanh(1.3856) + 0.2·1.25·tanh(.4) ≈ 0.8823 + 0.0950
    assert abs(md([1, 0, 0, 0], 4)[0].item() - 0.977) < 2e-3


def test_no_prospect_and_constraints():
    # without shaping, α=0.5, C=4, G=4: σ_goal = sqrt(4/16) = .5; r=[.75,.25,.5,.5]: mean .5, pop std sqrt(.125/4·... )
    # deviations [.25,−.25,0,0], pop var = (.0625·2)/4 = .03125 → std .17678; z = [√2, −√2, 0, 0]
    # μ_goal = max(.5,.5) = .5 → δ = [.5, −.5, 0, 0] → A = .5z + .5δ
    a = md([0.75, 0.25, 0.5, 0.5], 4, mdp_grpo_alpha=0.5, mdp_grpo_num_constraints=4, mdp_grpo_prospect=False)
    s2 = math.sqrt(2)
    torch.testing.assert_close(a, torch.tensor([0.5 * s2 + 0.25, -0.5 * s2 - 0.25, 0, 0], dtype=torch.float64))


def test_all_equal_groups_default_goal_mode():
    # z = 0 for all-equal groups. Mean ≥ .5 → μ_goal = mean → δ = 0 → A = 0 (official-code surprise)
    assert torch.equal(md([0.6] * 4, 4), torch.zeros(4, dtype=torch.float64))
    assert torch.equal(md([1.0] * 4, 4), torch.zeros(4, dtype=torch.float64))
    # mean .2 < .5: δ = −.3/1 → A = .2·2·tanh(−.24) ≈ −.0942
    torch.testing.assert_close(md([0.2] * 4, 4), torch.full((4,), 0.2 * pt(-0.3), dtype=torch.float64))


def test_all_equal_half_mode_nonzero():
    # catalog check: all-equal 0.6 with the fixed anchor .5 → δ = .1 → A = .2·1.25·tanh(.08) ≈ .01996
    a = md([0.6] * 4, 4, mdp_grpo_goal_mode="half")
    torch.testing.assert_close(a, torch.full((4,), 0.2 * pt(0.1), dtype=torch.float64))
    assert a[0] > 0
    # group_mean mode → δ = z·σ_pop/σ_goal … all-equal → 0
    assert torch.equal(md([0.6] * 4, 4, mdp_grpo_goal_mode="group_mean"), torch.zeros(4, dtype=torch.float64))


def test_prospect_loss_aversion_and_bound():
    # |PT(−x)| > |PT(x)| with λ− > λ+, and |A| ≤ max(λ+, λ−) = 2
    x = 0.7
    assert abs(pt(-x)) > abs(pt(x))
    a = md([1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1], 8, mdp_grpo_goal_mode="half")
    assert a.abs().max() <= 2.0
    # the lone failure gets a larger magnitude than the lone success (mirror groups)
    assert a[8].abs() > a[0].abs()


def test_official_script_lambdas_are_an_option():
    # shipped script: λ+ = 2.0, λ− = 1.25 → success gets .8·2·tanh(.8√3) + .2·2·tanh(.4)
    s3 = math.sqrt(3)
    a = md([1, 0, 0, 0], 4, mdp_grpo_lambda_pos=2.0, mdp_grpo_lambda_neg=1.25)
    torch.testing.assert_close(a[0], torch.tensor(0.8 * 2 * math.tanh(0.8 * s3) + 0.4 * math.tanh(0.4),
                                                  dtype=torch.float64))


def test_group_size_one_and_two():
    # G=1: z = 0; σ_goal = sqrt(1/4) = .5; r=.0 → δ = −1 → A = .2·2·tanh(−.8)
    torch.testing.assert_close(md([0.0, 1.0], 1), torch.tensor([0.2 * pt(-1.0), 0.0], dtype=torch.float64))
    # G=2, [1,0]: z = ±1; σ_goal = sqrt(2/4); μ_goal = .5 → δ = ±.5/√.5 = ±√.5
    h = math.sqrt(0.5)
    torch.testing.assert_close(md([1.0, 0.0], 2),
                               torch.tensor([0.8 * pt(1) + 0.2 * pt(h), 0.8 * pt(-1) + 0.2 * pt(-h)],
                                            dtype=torch.float64))


def test_nan_excluded_and_inf_raises():
    # NaN left out: [1, 0, NaN, 0] == group of three [1,0,0] (mean 1/3, pop std √2/3 → z = [√2, −1/√2]) with G=4 in σ_goal
    a = md([1, 0, NAN, 0], 4)
    s2 = math.sqrt(2)
    exp = [0.8 * pt(s2) + 0.2 * pt(0.5), 0.8 * pt(-1 / s2) + 0.2 * pt(-0.5), 0.0, 0.8 * pt(-1 / s2) + 0.2 * pt(-0.5)]
    torch.testing.assert_close(a, torch.tensor(exp, dtype=torch.float64))
    assert torch.equal(md([NAN] * 4, 4), torch.zeros(4, dtype=torch.float64))
    for bad in (INF, -INF):
        with pytest.raises(ValueError, match="mdp_grpo"):
            md([1, bad, 0, 0], 4)
    with pytest.raises(ValueError, match="mdp_grpo"):
        md([1.5, 0, 0, 0], 4)


def test_vectorised_groups_independent_and_dtype():
    a = md([1, 0, 0, 0, 0.6, 0.6, 0.6, 0.6], 4)
    torch.testing.assert_close(a[:4], md([1, 0, 0, 0], 4))
    assert a.dtype == torch.float64
    assert mdp_grpo_advantages(torch.tensor([1.0, 0.0]), 2).dtype == torch.float32


def test_validate():
    from types import SimpleNamespace

    from trl_groupx.advantages.mdp_grpo import _validate

    good = dict(mdp_grpo_alpha=0.2, mdp_grpo_num_constraints=1.0, mdp_grpo_goal_mode="max_half_and_group_mean",
                mdp_grpo_prospect=True, mdp_grpo_prospect_beta=0.8, mdp_grpo_lambda_pos=1.25, mdp_grpo_lambda_neg=2.0)
    _validate(SimpleNamespace(**good))
    for k, v in [("mdp_grpo_alpha", 1.5), ("mdp_grpo_num_constraints", 0.5), ("mdp_grpo_goal_mode", "midpoint"),
                 ("mdp_grpo_prospect_beta", 0), ("mdp_grpo_lambda_neg", -1), ("mdp_grpo_lambda_pos", NAN)]:
        with pytest.raises(ValueError, match=k):
            _validate(SimpleNamespace(**{**good, k: v}))
