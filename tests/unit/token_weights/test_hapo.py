"""HAPO token-weight parts (TLGA + DAR), hand-derived.

One group, G = 4, T = 3, rewards r = [1, 0, 0, 1], lengths L = [1, 3, 2, 2].
TLGA over tokens: Σ L = 8, μ = (1 + 2)/8 = 3/8,
σ² = [1·(5/8)² + 3·(3/8)² + 2·(3/8)² + 2·(5/8)²]/8 = (75 + 45)/512 = 15/64 → σ = √15/8,
A(r=1) = (5/8)/(√15/8) = 5/√15 =: a ≈ 1.2910,   A(r=0) = −3/√15 =: b ≈ −0.7746   (ε = 1e-6 ignored at 1e-5 tol).
DAR: entropies H = e^ℓ, ℓ on real tokens: row0 [0]; row1 [−2, −1, 0]; row2 [1, 2]; row3 [0, −1].
Sorted ℓ (8 tokens): −2 −1 −1 0 0 0 1 2; pivot 0.8 "nearest": index round(0.8·7) = round(5.6) = 6 → m = 1.
ℓ − m: row0 [−1]; row1 [−3, −2, −1]; row2 [0, 1]; row3 [−1, −2]; dividing by the spread s cancels in ĥ:
positive part / max(+) = 1, negative part / |min(−)| = 3 →
ĥ: row0 [−1/3]; row1 [−1, −2/3, −1/3]; row2 [0, 1]; row3 [−1/3, −2/3].
β = 1, factor 1 + ĥ where ĥ ≤ 0, else 1: row0 [2/3]; row1 [0, 1/3, 2/3]; row2 [1, 1]; row3 [2/3, 1/3].
(The official code's sign error would make every ĥ ≥ 0 and leave all factors at 1.)
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import hapo_token_advantages

MASK = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]])
ELL = torch.tensor([[0.0, 0, 0], [-2, -1, 0], [1, 2, 0], [0, -1, 0]])
PAD_JUNK = torch.tensor([[0, 1e6, -3.0], [0, 0, 0], [0, 0, 7.0], [0, 0, 1e-30]])
ENT = torch.where(MASK.bool(), ELL.exp(), PAD_JUNK)
R = torch.tensor([1.0, 0.0, 0.0, 1.0])
SEQ_ADV = torch.tensor([0.9, -0.8, -0.7, 0.6])  # incoming advantages (ignored by TLGA unless it falls back)
a, b = 5 / math.sqrt(15), -3 / math.sqrt(15)
FACTOR = torch.tensor([[2 / 3, 0, 0], [0, 1 / 3, 2 / 3], [1, 1, 0], [2 / 3, 1 / 3, 0]])
PARAMS = dict(hapo_token_group_norm=True, hapo_dar=True, hapo_adv_beta=1.0, hapo_entropy_pivot=0.8,
              hapo_fallback_threshold=5.0)


def run(advantages=SEQ_ADV, rewards=R, mask=MASK, entropies=ENT, group_size=4, **overrides):
    ctx = TokenContext(mask, group_size, entropies=entropies, rewards=rewards)
    return hapo_token_advantages(advantages, ctx, **{**PARAMS, **overrides})


def test_hand_values():
    expected = torch.tensor([[a], [b], [b], [a]]) * FACTOR
    torch.testing.assert_close(run(), expected, atol=1e-5, rtol=1e-5)


def test_parts_switch_off():
    tlga = torch.tensor([[a], [b], [b], [a]]) * MASK
    torch.testing.assert_close(run(hapo_dar=False), tlga, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run(hapo_adv_beta=0.0), tlga, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run(hapo_token_group_norm=False), SEQ_ADV[:, None] * FACTOR, atol=1e-6, rtol=1e-6)
    # β = 0.5: factor 1 + ĥ/2, e.g. row1 [1/2, 2/3, 5/6]
    torch.testing.assert_close(run(hapo_adv_beta=0.5)[1], b * torch.tensor([0.5, 2 / 3, 5 / 6]), atol=1e-5, rtol=1e-5)


def test_fallback_to_incoming_advantage():
    # threshold 1: |a| = 1.29 ≥ 1 → the whole group takes the incoming advantages
    torch.testing.assert_close(run(hapo_fallback_threshold=1.0), SEQ_ADV[:, None] * FACTOR, atol=1e-6, rtol=1e-6)


def test_padding_never_leaks():
    clean = run(entropies=torch.where(MASK.bool(), ENT, torch.ones_like(ENT)))
    for junk in (0.0, 1e9, -5.0, float("nan")):
        ent = torch.where(MASK.bool(), ENT, torch.full_like(ENT, junk))
        out = run(entropies=ent)
        torch.testing.assert_close(out, clean)
        assert (out[~MASK.bool()] == 0).all()


def test_all_equal_group_and_group_sizes():
    assert torch.equal(run(rewards=torch.ones(4)), torch.zeros(4, 3))  # σ = 0 → 0, DAR keeps 0
    assert torch.equal(run(group_size=1), torch.zeros(4, 3))  # G = 1: every group all-equal
    # G = 2: (r 1,0; L 1,3): μ = 1/4, σ = √3/4 → √3, −1/√3;  (r 0,1; L 2,2): μ = σ = 1/2 → −1, +1
    seq = torch.tensor([math.sqrt(3), -1 / math.sqrt(3), -1.0, 1.0])
    torch.testing.assert_close(run(group_size=2), seq[:, None] * FACTOR, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_nan_reward_excluded():
    # row3 unscored: members L = 1,3,2, r = 1,0,0: μ = 1/6, σ² = (25/36 + 5/36)/6 = 5/36 → √5, −1/√5
    rewards = torch.tensor([1.0, 0.0, 0.0, float("nan")])
    out = run(rewards=rewards, advantages=torch.tensor([0.9, -0.8, -0.7, float("nan")]))
    seq = torch.tensor([math.sqrt(5), -1 / math.sqrt(5), -1 / math.sqrt(5), 0.0])
    torch.testing.assert_close(out, seq[:, None] * FACTOR, atol=1e-5, rtol=1e-5)


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="token_weighting='hapo'.*inf"):
        run(rewards=torch.tensor([1.0, float("inf"), 0.0, 1.0]))


def test_empty_completion():
    # row0 empty: members L = 3,2,2, r = 0,0,1: μ = 2/7, σ² = (5·4/49 + 2·25/49)/7 = 10/49 → −2/√10, 5/√10.
    # Entropies: 7 real ℓ = −2 −1 −1 0 0 1 2, index round(0.8·6) = 5 → m = 1 again, factors unchanged.
    mask = MASK.clone()
    mask[0] = 0
    out = run(mask=mask)
    seq = torch.tensor([0.0, -2 / math.sqrt(10), -2 / math.sqrt(10), 5 / math.sqrt(10)])
    torch.testing.assert_close(out, seq[:, None] * FACTOR * mask, atol=1e-5, rtol=1e-5)
    assert torch.equal(run(mask=torch.zeros(4, 3, dtype=torch.long)), torch.zeros(4, 3))


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="hapo")
    cfg = GRPOConfig(**base)
    assert cfg.hapo_entropy_pivot == 0.8 and cfg.hapo_adv_beta == 1.0 and cfg.hapo_fallback_threshold == 5.0
    with pytest.raises(ValueError, match="hapo_entropy_pivot"):
        GRPOConfig(**base, hapo_entropy_pivot=1.5)
    with pytest.raises(ValueError, match="hapo_adv_beta"):
        GRPOConfig(**base, hapo_adv_beta=-1.0)
    with pytest.raises(ValueError, match="hapo_fallback_threshold"):
        GRPOConfig(**base, hapo_fallback_threshold=0.0)
    with pytest.raises(ValueError, match="num_iterations=1"):
        GRPOConfig(**base, num_iterations=2)
    GRPOConfig(**base, num_iterations=2, hapo_dar=False)
