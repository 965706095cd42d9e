"""Temporal credit (RLVR-Schedule suffix curriculum), hand-derived. Two groups of G = 2, T = 5.

| row | A    | mask      | L | m = 0.5, step 0 → ρ = 0.5: P = min(⌊L·ρ⌋, L − 1)              |
|  0  | 1    | 1 1 1 1 0 | 4 | ⌊2.0⌋ = 2 → trained t = 2, 3                                   |
|  1  | −1   | 1 1 1 0 0 | 3 | ⌊1.5⌋ = 1 → trained t = 1, 2                                   |
|  2  | 0.5  | 1 0 0 0 0 | 1 | min(⌊0.5⌋, 0) = 0 → trained t = 0                              |
|  3  | −0.5 | 1 1 1 1 1 | 5 | ⌊2.5⌋ = 2 → trained t = 2, 3, 4                                |
Padding holds junk (1e6) in the incoming context and must never show up in the output.
Official default m = 0.99: L = 4 → P = min(⌊3.96⌋, 3) = 3 → only the last token is trained.
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import temporal_credit_token_advantages
from trl_groupx.token_weights.temporal_credit import prefix_ratio

MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
JUNK = torch.where(MASK.bool(), torch.zeros(4, 5), torch.full((4, 5), 1e6))
A = torch.tensor([1.0, -1.0, 0.5, -0.5])
R = torch.tensor([1.0, 0.0, 1.0, 0.0])
KEPT = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.float)
PARAMS = dict(temporal_credit_magnitude=0.5, temporal_credit_end_fraction=0.8, temporal_credit_schedule="linear")


def run(advantages=A, rewards=R, mask=MASK, group_size=2, global_step=0, total_steps=10, **overrides):
    ctx = TokenContext(mask, group_size, logps=JUNK[: mask.shape[0]], entropies=JUNK[: mask.shape[0]],
                       rewards=rewards)
    return temporal_credit_token_advantages(advantages, ctx, **{**PARAMS, **overrides}, global_step=global_step,
                                            total_steps=total_steps)


def test_hand_values_step0():
    torch.testing.assert_close(run(), A[:, None] * KEPT)


def test_official_default_trains_only_last_token_at_step0():
    out = run(temporal_credit_magnitude=0.99)
    last = torch.zeros(4, 5)
    for i, length in enumerate(MASK.sum(-1).tolist()):
        last[i, length - 1] = 1.0  # ⌊0.99·L⌋ = L − 1 for L ≤ 100
    torch.testing.assert_close(out, A[:, None] * last)


def test_schedule_and_end_is_grpo():
    # linear, end step = 0.8·10 = 8: step 4 → p = 0.5 → ρ = 0.25
    assert prefix_ratio(0.5, "linear", 2.0, 4, 8.0) == 0.25
    assert prefix_ratio(0.5, "gamma", 2.0, 4, 8.0) == 0.0625
    assert prefix_ratio(0.5, "sigmoid", 2.0, 0, 8.0) == pytest.approx(0.5)
    assert prefix_ratio(0.5, "sigmoid", 2.0, 4, 8.0) == pytest.approx(0.25)  # symmetric around p = 0.5
    assert prefix_ratio(0.5, "sigmoid", 2.0, 8, 8.0) == pytest.approx(0.0, abs=1e-12)
    assert prefix_ratio(0.5, "linear", 2.0, 7, 0.0) == 0.5  # unknown training length: step 0
    # step 4 of 10 (ρ = 0.25): P = ⌊1⌋, ⌊0.75⌋, 0, ⌊1.25⌋ = 1, 0, 0, 1
    kept = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.float)
    torch.testing.assert_close(run(global_step=4), A[:, None] * kept)
    # from step 8 on (0.8 of 10): ρ = 0 → exactly GRPO's broadcast advantages
    for step in (8, 9, 50):
        assert torch.equal(run(global_step=step), A[:, None] * MASK)


def test_all_equal_group_and_nan_reward():
    out = run(advantages=torch.tensor([0.0, 0.0, 0.5, -0.5]))
    assert torch.equal(out[:2], torch.zeros(2, 5))
    rewards = torch.tensor([1.0, float("nan"), 1.0, 0.0])
    out = run(advantages=torch.tensor([1.0, float("nan"), 0.5, -0.5]), rewards=rewards)
    assert torch.equal(out[1], torch.zeros(5)) and torch.isfinite(out).all()
    torch.testing.assert_close(out[[0, 2, 3]], (A[:, None] * KEPT)[[0, 2, 3]])


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="temporal_credit"):
        run(rewards=torch.tensor([1.0, float("inf"), 0.0, 0.0]))


def test_group_sizes_one_and_two_and_bad_n():
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = run(advantages=torch.tensor([0.0]), rewards=torch.tensor([1.0]), mask=mask, group_size=1)
    assert torch.equal(out, torch.zeros(1, 5))  # G = 1: the incoming advantage is 0
    torch.testing.assert_close(run(group_size=2), A[:, None] * KEPT)
    with pytest.raises(ValueError):
        run(group_size=3)


def test_empty_and_truncated_completions():
    mask = torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    out = run(mask=mask)
    assert torch.equal(out[0], torch.zeros(5))  # empty: nothing to train, no crash
    torch.testing.assert_close(out[1], -1.0 * torch.tensor([0.0, 0, 1, 1, 1]))  # truncated (full row): P = 2
    torch.testing.assert_close(out[2], 0.5 * torch.tensor([0.0, 1, 0, 0, 0]))  # L = 2: P = 1


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    GRPOConfig(**base, token_weighting="temporal_credit")
    for bad in (dict(temporal_credit_magnitude=1.0), dict(temporal_credit_magnitude=-0.1),
                dict(temporal_credit_end_fraction=0.0), dict(temporal_credit_schedule="cosine"),
                dict(temporal_credit_gamma=0.0), dict(loss_type="gmpo")):
        with pytest.raises(ValueError, match="temporal_credit|gmpo"):
            GRPOConfig(**base, token_weighting="temporal_credit", **bad)
    assert math.isclose(GRPOConfig(**base).temporal_credit_magnitude, 0.99)
