"""VeriGate (outcome-level gating): verifier GRPO advantages in groups the verifier separates, PRM group z-scores
in degenerate (all-equal) groups; derivations in comments. No official code (arXiv:2605.30451)."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.advantages.verigate import verigate_advantages as vg

NAN = float("nan")
EPS = 1e-4


def test_catalog_check_mixed_group_is_grpo_and_ignores_the_prm():
    # outcome [0,1,0,1]: mean .5, unbiased std sqrt(1/3) → ∓.5/(sqrt(1/3)+1e-4), whatever the PRM says
    o = torch.tensor([0.0, 1.0, 0.0, 1.0])
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    for p in (torch.tensor([0.9, 0.1, 0.5, 0.3]), torch.tensor([NAN, 5.0, -2.0, 0.0])):
        out = vg(torch.stack([o, p], 1), 4)
        torch.testing.assert_close(out, torch.tensor([-a, a, -a, a]))
        torch.testing.assert_close(out, group_normalized_advantages(o, 4))  # identical to GRPO


def test_all_wrong_and_all_correct_groups_use_the_prm():
    # all-0 group, PRM [.1,.3,.5,.9]: mean .45, var = (.1225+.0225+.0025+.2025)/3 = .35/3 → std sqrt(.35/3)
    p = torch.tensor([0.1, 0.3, 0.5, 0.9])
    s = math.sqrt(0.35 / 3) + EPS
    expected = (p - 0.45) / s
    torch.testing.assert_close(vg(torch.stack([torch.zeros(4), p], 1), 4), expected)
    torch.testing.assert_close(vg(torch.stack([torch.ones(4), p], 1), 4), expected)  # all-correct: same
    # a degenerate group where the PRM is constant too → 0
    assert torch.equal(vg(torch.stack([torch.zeros(4), torch.full((4,), 0.7)], 1), 4), torch.zeros(4))


def test_gating_is_per_group_and_zero_gradient_groups_drop():
    # group 0 mixed → GRPO on outcome; group 1 all-wrong → PRM z-score
    r = torch.tensor([[0.0, 0.1], [1.0, 0.2], [0.0, 0.3], [1.0, 0.4],
                      [0.0, 0.9], [0.0, 0.5], [0.0, 0.1], [0.0, 0.3]])
    out = vg(r, 4)
    torch.testing.assert_close(out[:4], group_normalized_advantages(r[:4, 0], 4))
    p = r[4:, 1]
    torch.testing.assert_close(out[4:], (p - p.mean()) / (p.std() + EPS))
    grpo = group_normalized_advantages(r[:, 0], 4).view(2, 4)
    assert (grpo.abs().sum(1) == 0).sum() == 1 and (out.view(2, 4).abs().sum(1) == 0).sum() == 0


def test_nan_in_either_column():
    # outcome NaN on row 1: excluded; scored outcomes [0,0,0] → degenerate → PRM over rows 0,2,3 = [.2,?,.8,.5]
    # row 3 PRM NaN too → PRM set rows 0,2 = [.2,.8]: mean .5, std .3*sqrt(2) → ∓.3/(.3*sqrt(2)+1e-4)
    r = torch.tensor([[0.0, 0.2], [NAN, 0.9], [0.0, 0.8], [0.0, NAN]])
    z = 0.3 / (0.3 * math.sqrt(2) + EPS)
    torch.testing.assert_close(vg(r, 4), torch.tensor([-z, 0.0, z, 0.0]))
    # outcome NaN in a mixed group: excluded from the GRPO statistics ([1,0,1]: mean 2/3, std sqrt(1/3))
    r = torch.tensor([[1.0, 0.2], [NAN, 0.9], [0.0, 0.8], [1.0, 0.1]])
    s = math.sqrt(1 / 3) + EPS
    torch.testing.assert_close(vg(r, 4), torch.tensor([(1 / 3) / s, 0.0, (-2 / 3) / s, (1 / 3) / s]))
    # unscored rows and a whole unscored group → 0, finite
    r = torch.tensor([[NAN, NAN], [NAN, NAN], [NAN, 0.5], [0.0, 0.4]])
    assert torch.equal(vg(r, 2), torch.zeros(4))
    # the contract's (N,) input: verifier only → GRPO, degenerate groups 0
    v = torch.tensor([1.0, 0.0, NAN, 1.0, 0.0, 0.0, 0.0, 0.0])
    out = vg(v, 4)
    assert out[2] == 0 and out[4:].eq(0).all() and torch.isfinite(out).all()


def test_group_size_one_and_two():
    r = torch.tensor([[1.0, 0.2], [0.0, 0.9]])
    assert torch.equal(vg(r, 1), torch.zeros(2))  # one response: degenerate, but no PRM contrast either
    # G=2 mixed: ±.5/(sqrt(.5)+1e-4); G=2 degenerate: PRM [.2,.9] → ∓.35/(.35*sqrt(2)+1e-4)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(vg(r, 2), torch.tensor([a, -a]))
    z = 0.35 / (0.35 * math.sqrt(2) + EPS)
    torch.testing.assert_close(vg(torch.tensor([[0.0, 0.2], [0.0, 0.9]]), 2), torch.tensor([-z, z]))


def test_column_indices():
    r = torch.tensor([[0.0, 0.1], [0.0, 0.3], [0.0, 0.5], [0.0, 0.9]])
    r3 = torch.stack([r[:, 1], torch.full((4,), 3.0), r[:, 0]], 1)
    torch.testing.assert_close(vg(r3, 4, verigate_outcome_reward_index=2, verigate_process_reward_index=0), vg(r, 4))


def test_errors():
    with pytest.raises(ValueError, match="advantage_estimator='verigate'.*infinite"):
        vg(torch.tensor([[0.0, -float("inf")], [0.0, 1.0]]), 2)
    with pytest.raises(ValueError, match="at least two reward functions.*verigate_outcome_reward_index"):
        vg(torch.zeros(4, 1), 2)
    with pytest.raises(ValueError, match="verigate_outcome_reward_index=5 is out of range for 2"):
        vg(torch.zeros(4, 2), 2, verigate_outcome_reward_index=5)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"verigate_process_reward_index": 0}, "both 0"),
        ({"verigate_outcome_reward_index": -2}, "verigate_outcome_reward_index must be a non-negative integer"),
        ({"verigate_process_reward_index": True}, "verigate_process_reward_index must be a non-negative integer"),
    ],
)
def test_config_validation(flags, match):
    with pytest.raises(ValueError, match=match):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, advantage_estimator="verigate", **flags)


def test_registered():
    v = trl_groupx.get_variant("verigate")
    assert v.stage == "advantages" and "rewards_per_func" in v.requires and v.official_code is None
    with pytest.raises(ValueError):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, verigate_process_reward_index=2)
