"""GTPO conflict tokens + entropy filter, hand-derived (W = 2, H_max = 0.7, c = 0.1).

One group, G = 4:
| row | A  | tokens   | entropies (mean H̄) |
|  0  | +1 | 5 6 7    | .1 .2 .3  (0.2)     |
|  1  | −1 | 5 9 7    | .5 .5 .5  (0.5)     |
|  2  | +1 | 5 6 pad  | 1. 1. pad (1.0)     |   H̄ > 0.7 → dropped (but still a positive for conflicts)
|  3  | −1 | 4 4 4    | .3 .3 .3  (0.3)     |
Prefix run: t0 token 5 is in a positive (0, 2) and a negative (1) → conflict for rows 0, 1, 2; t1: 6 vs 9/4 → run
ends. Suffix run (right-aligned): last tokens 7 (row0 +), 7 (row1 −), 6 (row2), 4 (row3) → rows 0, 1 at t2;
next from the end 6 vs 9 → ends. Conflict sets: row0 {t0, t2} (n=2), row1 {t0, t2} (n=2), row2 {t0} (n=1),
row3 none (n=1). δ: row0 [2, 1, 2], row1 [0, 1, 0], row2 [2, 1], row3 [1, 1, 1].
A' = (A − 0.1·H̄)/n · δ: row0 0.98/2·[2,1,2] = [.98, .49, .98]; row1 −1.05/2·[0,1,0] = [0, −.525, 0];
row2 dropped → 0; row3 −1.03·[1,1,1].
(Catalog check: A(+) 'x y z', B(−) 'x q z' → x@0 and z@2 conflict: B's weight 0 there, A's doubled.)
"""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import gtpo_conflict_token_advantages

IDS = torch.tensor([[5, 6, 7], [5, 9, 7], [5, 6, 0], [4, 4, 4]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
ENT = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 0.5], [1.0, 1.0, 50.0], [0.3, 0.3, 0.3]])
A = torch.tensor([1.0, -1.0, 1.0, -1.0])
R = torch.tensor([1.0, 0.0, 1.0, 0.0])
EXPECTED = torch.tensor([[0.98, 0.49, 0.98], [0, -0.525, 0], [0, 0, 0], [-1.03, -1.03, -1.03]])
PARAMS = dict(gtpo_conflict_weight=2.0, gtpo_conflict_entropy_max=0.7, gtpo_conflict_entropy_coef=0.1,
              gtpo_conflict_normalize=True)


def run(advantages=A, rewards=R, mask=MASK, ids=IDS, entropies=ENT, group_size=4, **overrides):
    ctx = TokenContext(mask, group_size, entropies=entropies, completion_ids=ids, rewards=rewards)
    return gtpo_conflict_token_advantages(advantages, ctx, **{**PARAMS, **overrides})


def test_hand_values():
    torch.testing.assert_close(run(), EXPECTED)


def test_options():
    # no ÷ n: row0 0.98·[2, 1, 2]
    torch.testing.assert_close(run(gtpo_conflict_normalize=False)[0], torch.tensor([1.96, 0.98, 1.96]))
    # no entropy filter: row2 (1 − 0.1)/1·[2, 1] = [1.8, 0.9]
    torch.testing.assert_close(run(gtpo_conflict_entropy_max=float("inf"))[2], torch.tensor([1.8, 0.9, 0.0]))
    # c = 0, W = 1: only the negative conflict tokens are silenced, then ÷ n
    out = run(gtpo_conflict_entropy_coef=0.0, gtpo_conflict_weight=1.0)
    torch.testing.assert_close(out[:2], torch.tensor([[0.5, 0.5, 0.5], [0, -0.5, 0]]))


def test_padding_never_leaks():
    for junk in (4, 5, 6, 7, 9):
        ids = IDS.clone()
        ids[2, 2] = junk
        torch.testing.assert_close(run(ids=ids), EXPECTED)
    for junk in (0.0, 1e6, float("nan")):
        ent = ENT.clone()
        ent[2, 2] = junk
        torch.testing.assert_close(run(entropies=ent), EXPECTED)
    assert run()[2, 2] == 0


def test_all_equal_group_gets_entropy_term_only():
    # A = 0 everywhere: no positive/negative sets, no conflicts; kept rows get −0.1·H̄ (official behaviour)
    expected = torch.tensor([[-0.02] * 3, [-0.05] * 3, [0.0] * 3, [-0.03] * 3])
    torch.testing.assert_close(run(torch.zeros(4), torch.ones(4)), expected)
    torch.testing.assert_close(run(torch.zeros(4), group_size=1), expected)  # G = 1: A = 0 from TRL


def test_group_size_two():
    # groups (0,1) and (2,3): rows 0/1 conflicts unchanged; row2 (+ '5 6') vs row3 (− '4 4 4') share nothing
    out = run(group_size=2, gtpo_conflict_entropy_max=float("inf"))
    torch.testing.assert_close(out[:2], EXPECTED[:2])
    torch.testing.assert_close(out[2], torch.tensor([0.9, 0.9, 0.0]))  # G = 4 gave [1.8, 0.9]
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_nan_reward_is_neither_positive_nor_negative():
    # row1 unscored → 0, and no negative shares row0's tokens at t0/t2 → no conflicts left
    rewards, adv = R.clone(), A.clone()
    rewards[1], adv[1] = float("nan"), float("nan")
    expected = torch.tensor([[0.98] * 3, [0.0] * 3, [0.0] * 3, [-1.03] * 3])
    torch.testing.assert_close(run(adv, rewards), expected)


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="token_weighting='gtpo_conflict'.*inf"):
        run(rewards=torch.tensor([1.0, float("inf"), 1.0, 0.0]))


def test_empty_completion():
    mask = MASK.clone()
    mask[1] = 0  # row1 empty: it supplies no tokens, so nothing is in conflict
    expected = torch.tensor([[0.98] * 3, [0.0] * 3, [0.0] * 3, [-1.03] * 3])
    torch.testing.assert_close(run(mask=mask), expected)


def test_suffix_alignment_uses_lengths():
    # positive '1 2 3' and negative '8 3' (shorter): the last tokens (3) conflict although at different t
    ids = torch.tensor([[1, 2, 3], [8, 3, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = run(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]), mask, ids, torch.zeros(2, 3), group_size=2)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0, 2.0], [-1.0, 0.0, 0.0]]))


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="gtpo_conflict")
    assert GRPOConfig(**base).gtpo_conflict_entropy_max == 0.7
    with pytest.raises(ValueError, match="gtpo_conflict_weight"):
        GRPOConfig(**base, gtpo_conflict_weight=-1.0)
    with pytest.raises(ValueError, match="gtpo_conflict_entropy_max"):
        GRPOConfig(**base, gtpo_conflict_entropy_max=0.0)
    with pytest.raises(ValueError, match="gtpo_conflict_entropy_coef"):
        GRPOConfig(**base, gtpo_conflict_entropy_coef=-0.1)
