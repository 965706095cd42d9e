"""WAPO token weights (positive-advantage completions only), hand-derived.

Two groups of G=4, T=3, advantages as TRL gives them with scale_rewards="none" (A = r − mean):

| seq | r | A     | mask  | kept A |
|  0  | 1 | +0.5  | 1 1 1 | 0.5    |
|  1  | 0 | -0.5  | 1 1 0 | 0      |
|  2  | 0 | -0.5  | 1 0 0 | 0      |
|  3  | 1 | +0.5  | 1 1 0 | 0.5    |
|  4  | 1 |  0    | 1 1 1 | 0      |   group 1: all equal → no positive completion
|  5  | 1 |  0    | 0 0 0 | 0      |   (empty completion)
|  6  | 1 |  0    | 1 0 0 | 0      |
|  7  | 1 |  0    | 1 1 1 | 0      |

#groups = 2, #groups with a positive = 1 → s = 2, so rows 0 and 3 carry 1.0 on their tokens, all else 0.
"""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import wapo_token_advantages

NAN = float("nan")
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 1]])
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
A = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])


def junk_ctx(mask=MASK, rewards=R, group_size=4):
    # every per-token tensor holds huge junk at padding; WAPO must not read any of it
    n, t = mask.shape
    junk = torch.where(mask.bool(), torch.rand(n, t), torch.full((n, t), 1e9))
    return TokenContext(mask, group_size, entropies=junk, logps=-junk, ref_logps=junk, rewards=rewards)


def run(advantages=A, scale=True, **ctx_kwargs):
    return wapo_token_advantages(advantages, junk_ctx(**ctx_kwargs), wapo_positive_group_scale=scale)


def test_hand_values_with_positive_group_scale():
    expected = torch.zeros(8, 3)
    expected[0] = 1.0
    expected[3, :2] = 1.0
    torch.testing.assert_close(run(), expected)


def test_hand_values_without_scale():
    expected = torch.zeros(8, 3)
    expected[0] = 0.5
    expected[3, :2] = 0.5
    torch.testing.assert_close(run(scale=False), expected)


def test_matches_official_normaliser_under_dr_grpo():
    # Official loss at ratio 1 (orchestrator.py l.494-557 + trainer.py l.1274-1282):
    #   Σ_i Σ_t -A_i·1[A_i>0]·m_it / (G · L) / #groups-with-a-positive
    # TRL dr_grpo on our advantages: Σ_i Σ_t -A'_it·m_it / (N · L).
    adv = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.25, -0.75, 0.25, 0.25, 0.0, 0.0, 0.0, 0.0])
    mask = torch.ones(12, 5)
    mask[1, 2:] = 0
    mask[4, 1:] = 0
    mask[6, 3:] = 0
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1])
    G, L = 4, 5
    official = sum(-a * m.sum() for a, m in zip(adv, mask) if a > 0) / (G * L) / 2
    ours = -(run(adv, mask=mask, rewards=rewards) * mask).sum() / (12 * L)
    torch.testing.assert_close(ours, official.float())


def test_all_equal_groups_give_zero():
    out = run(torch.zeros(8))
    assert torch.equal(out, torch.zeros(8, 3))


def test_group_size_one_and_two():
    # G=1: TRL gives A=0 → nothing trains
    assert torch.equal(run(torch.zeros(8), group_size=1), torch.zeros(8, 3))
    # G=1 with a custom estimator's advantages: rows 0 and 3 positive, 8 groups, 2 positive → s = 4
    out = run(A, group_size=1)
    assert out[0, 0] == 2.0 and out[3, 0] == 2.0 and out[1].abs().sum() == 0
    # G=2: groups (0,1), (2,3), (4,5), (6,7): positives in groups 0 and 1 → s = 4/2 = 2
    out = run(torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]), group_size=2)
    torch.testing.assert_close(out[:, 0], torch.tensor([1.0, 0, 0, 1.0, 0, 0, 0, 0]))


def test_nan_rewards_get_zero_and_do_not_make_a_group_positive():
    rewards = R.clone()
    rewards[4] = NAN  # group 1: the only "positive" is unscored
    adv = A.clone()
    adv[4] = NAN
    adv[6] = 0.7  # a positive that remains
    rewards[1] = NAN
    adv[1] = 3.0  # junk advantage on an unscored rollout: ignored
    out = run(adv, rewards=rewards)
    # positives: rows 0, 3 (group 0), 6 (group 1) → s = 2/2 = 1
    assert out[1].abs().sum() == 0 and out[4].abs().sum() == 0
    torch.testing.assert_close(out[6], torch.tensor([0.7, 0.0, 0.0]))
    torch.testing.assert_close(out[0], torch.tensor([0.5, 0.5, 0.5]))
    assert torch.isfinite(out).all()


def test_inf_reward_is_a_clear_error():
    rewards = R.clone()
    rewards[2] = float("inf")
    with pytest.raises(ValueError, match="token_weighting='wapo'.*inf"):
        run(rewards=rewards)


def test_empty_and_truncated_completions_and_padding():
    out = run()
    assert (out[~MASK.bool()] == 0).all()
    assert torch.equal(out[5], torch.zeros(3))  # empty completion
    adv = A.clone()
    adv[5] = 1.0  # an empty completion with a positive advantage: no tokens, but its group counts as positive
    out = run(adv)
    assert torch.equal(out[5], torch.zeros(3)) and out[0, 0] == 0.5  # s = 2/2


def test_indivisible_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_config_flags_and_validation(tmp_path):
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="wapo")
    assert cfg.wapo_positive_group_scale is True
    with pytest.raises(ValueError, match="wapo_positive_group_scale=False belongs to variant .wapo."):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, wapo_positive_group_scale=False)
    with pytest.raises(ValueError, match="wapo_positive_group_scale must be True or False"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="wapo",
                   wapo_positive_group_scale="yes")
