"""GTPO / GRPO-S on the hand-derived example (G=4, α1=1, α2=0.1); see the docstring of gtpo_token_advantages.

| seq | r | mask  | H           |
|  0  | 1 | 1 1 1 | 1.0 2.0 0.5 |
|  1  | 1 | 1 1 0 | 3.0 2.0  -  |
|  2  | 0 | 1 1 1 | 0.5 1.0 2.0 |
|  3  | 0 | 1 0 0 | 2.0  -   -  |

Shaped: t=0: O+ ΣH=4, d=2 → 1+0.1·(1/4)·2 = 1.05, 1+0.1·(3/4)·2 = 1.15; O- Σ1/H = 2.5, h=2 → -1-0.1·(2/2.5)·2 = -1.16,
-1-0.1·(0.5/2.5)·2 = -1.04. t=1: 1.10, 1.10, -1.10. t=2: 1.10, -1.10.
Separate z-scores (unbiased): O+ {1.05,1.10,1.10,1.15,1.10}: mean 1.1, std sqrt(.005/4) → ±sqrt(2);
O- {-1.16,-1.10,-1.10,-1.04}: mean -1.1, std sqrt(.0072/3) → ±sqrt(1.5).
"""

import math

import pytest
import torch

from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import gtpo_token_advantages

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
H = torch.tensor([[1.0, 2.0, 0.5], [3.0, 2.0, 99.0], [0.5, 1.0, 2.0], [2.0, 77.0, 55.0]])  # padding values are junk
R = torch.tensor([1.0, 1.0, 0.0, 0.0])
PARAMS = dict(gtpo_alpha1=1.0, gtpo_alpha2=0.1, gtpo_normalization="separate", gtpo_success_threshold=0.0)


def run(rewards=R, entropies=H, mask=MASK, group_size=4, **overrides):
    ctx = TokenContext(completion_mask=mask, group_size=group_size, entropies=entropies, rewards=rewards)
    params = {**PARAMS, "gtpo_level": "token", **overrides}
    return gtpo_token_advantages(torch.zeros(len(rewards)), ctx, **params)


def test_gtpo_separate_hand_values():
    s2, s15 = math.sqrt(2), math.sqrt(1.5)
    expected = torch.tensor([[-s2, 0, 0], [s2, 0, 0], [-s15, 0, 0], [s15, 0, 0]])
    torch.testing.assert_close(run(), expected, atol=2e-4, rtol=0)


def test_gtpo_joint_hand_values():
    # one z-score over all 9 scored tokens: mean (5.5 - 4.4)/9, unbiased std
    vals = torch.tensor([1.05, 1.10, 1.10, 1.15, 1.10, -1.16, -1.10, -1.10, -1.04])
    z = (vals - vals.mean()) / vals.std()
    expected = torch.tensor([[z[0], z[1], z[2]], [z[3], z[4], 0], [z[5], z[6], z[7]], [z[8], 0, 0]])
    torch.testing.assert_close(run(gtpo_normalization="joint"), expected, atol=1e-4, rtol=0)
    assert (run(gtpo_normalization="joint")[:2][MASK[:2].bool()] > 0).all()  # joint keeps the outcome sign here


def test_padding_never_leaks():
    other = H.clone()
    other[~MASK.bool()] = 1e6
    torch.testing.assert_close(run(entropies=other), run())
    assert (run()[~MASK.bool()] == 0).all()


def test_grpo_s_hand_values():
    # Ĥ = [3.5/3, 2.5, 3.5/3, 2]; r̂ = [1.0636364, 1.1363636, -1.1263158, -1.0736842]; z over the group (unbiased)
    r_hat = torch.tensor([1 + 0.2 * (3.5 / 3) / (3.5 / 3 + 2.5), 1 + 0.2 * 2.5 / (3.5 / 3 + 2.5),
                          -1 - 0.2 * (3 / 3.5) / (3 / 3.5 + 0.5), -1 - 0.2 * 0.5 / (3 / 3.5 + 0.5)])
    seq = (r_hat - r_hat.mean()) / (r_hat.std() + 1e-6)
    torch.testing.assert_close(seq, torch.tensor([0.83705, 0.89428, -0.88637, -0.84495]), atol=1e-4, rtol=0)
    torch.testing.assert_close(run(gtpo_level="sequence"), seq[:, None] * MASK, atol=1e-4, rtol=0)


def test_constant_entropy_separate_is_zero_and_sequence_matches_grpo():
    flat = torch.ones_like(H)
    # every success token gets α1+α2 exactly → zero variance in each set → zero advantage
    assert run(entropies=flat).abs().max() < 1e-6
    # GRPO-S with equal entropies: r̂ = ±(β1+β2) → plain GRPO's z-score of [1,1,0,0]
    grpo = (R - R.mean()) / (R.std() + 1e-6)
    torch.testing.assert_close(run(entropies=flat, gtpo_level="sequence"), grpo[:, None] * MASK, atol=1e-5, rtol=0)


def test_nan_reward_row_gets_zero_and_is_left_out():
    r = torch.tensor([1.0, 1.0, 0.0, float("nan")])
    out = run(rewards=r)
    assert (out[3] == 0).all() and torch.isfinite(out).all()
    # seq 3 out of O-: at t=0 O- = {2} alone, so seq 2's t=0 reward is -1.1 like the rest → O- has zero variance
    assert out[2].abs().max() < 1e-2  # (float noise over sqrt(var + 1e-8) only)


@pytest.mark.parametrize("group_size", [1, 2])
def test_small_groups(group_size):
    out = run(group_size=group_size)
    assert out.shape == (4, 3) and torch.isfinite(out).all()
    seq = run(group_size=group_size, gtpo_level="sequence")
    if group_size == 1:
        assert (seq == 0).all()  # a group of one has no spread


def test_all_equal_outcome_group_still_ranks_by_entropy():
    out = run(rewards=torch.ones(4))
    assert out.abs().max() > 0.5 and torch.isfinite(out).all()


def test_empty_completion():
    mask = MASK.clone()
    mask[3] = 0
    out = run(mask=mask)
    assert (out[3] == 0).all() and torch.isfinite(out).all()
    seq = run(mask=mask, gtpo_level="sequence")
    assert (seq[3] == 0).all() and torch.isfinite(seq).all()


def test_missing_entropies_is_a_clear_error():
    ctx = TokenContext(completion_mask=MASK, group_size=4, rewards=R)
    with pytest.raises(ValueError, match="entropies"):
        gtpo_token_advantages(torch.zeros(4), ctx, gtpo_level="token", **PARAMS)
