"""TW-GRPO token weights (token_weighting="tw_grpo").

The divergence `D_t = (1/G) Σ_i Σ_v k3(m_{t,v} − l_{i,t,v})` on hand-made `(G, T, V)` distributions, the min-max
weights in `[1, α]`, the official function re-implemented with plain loops (read from
longmalongma/TW-GRPO@aa529ffca7ae408e4f3df7ba71cb0dc58544c6b7:src/open_r1/trainer/grpo_trainer.py,
`compute_token_importance_kl_logs_uniform` l.640–690), and the edge cases.
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights.tw_grpo import (
    group_token_divergence,
    tw_grpo_token_advantages,
    tw_grpo_token_weights,
)


def official_loops(logps: torch.Tensor, mask: torch.Tensor, group_size: int, max_weight: float) -> torch.Tensor:
    """The official weights, one group, position, member and vocabulary entry at a time: uniform `−log V` where the
    mask is 0, mean of the log-probs over the group, clamped k3 summed over V and averaged over G, min-max over all
    `T` positions of the batch, `1 + (α − 1)·norm`, times the completion mask."""
    n, t_len, vocab = logps.shape
    out = torch.zeros(n, t_len, dtype=torch.float64)
    for g in range(0, n, group_size):
        kl = []
        for t in range(t_len):
            filled = [[float(logps[i, t, v]) if mask[i, t] == 1 else -math.log(vocab) for v in range(vocab)]
                      for i in range(g, g + group_size)]
            mean = [sum(row[v] for row in filled) / group_size for v in range(vocab)]
            total = 0.0
            for row in filled:
                for v in range(vocab):
                    d = min(max(mean[v] - row[v], -11.0), 11.0)
                    total += math.exp(d) - d - 1.0
            kl.append(total / group_size)
        lo, hi = min(kl), max(kl)
        for i in range(g, g + group_size):
            for t in range(t_len):
                out[i, t] = (1.0 + (max_weight - 1.0) * (kl[t] - lo) / (hi - lo + 1e-8)) * float(mask[i, t])
    return out


def log_dist(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


def ctx_for(divergence, mask, group_size, rewards=None):
    return TokenContext(completion_mask=mask, group_size=group_size, rewards=rewards,
                        intra_group_token_divergence=divergence)


def test_identical_completions_have_zero_divergence_and_weight_one():
    dist = torch.softmax(torch.randn(3, 5), dim=-1).log()  # (T=3, V=5)
    logps = torch.stack([dist, dist])  # two identical completions
    d = group_token_divergence(logps, torch.ones(2, 3))
    assert torch.equal(d, torch.zeros(3))
    w = tw_grpo_token_weights(d.expand(2, 3), torch.ones(2, 3), 2, 1.7)
    assert torch.equal(w, torch.ones(2, 3))  # (0 − 0)/(0 + 1e-8) = 0 → weight 1


def test_hand_derived_divergence_and_the_diverging_token_gets_alpha():
    # G = 2, V = 2, T = 3; the completions agree at t = 0 and t = 2 and differ at t = 1: p1 = (½, ½), p2 = (0.8, 0.2).
    # With δ_v = log p2_v − log p1_v the log-space mean gives member 1 the log-ratio +δ_v/2 and member 2 −δ_v/2, so
    # D = ½ Σ_v [(e^{δ/2} − δ/2 − 1) + (e^{−δ/2} + δ/2 − 1)] = Σ_v (cosh(δ_v/2) − 1)
    #   = (cosh(½ log 1.6) − 1) + (cosh(½ log 0.4) − 1) = 0.027740 + 0.106797 = 0.134537.
    same = [0.3, 0.7]
    logps = torch.stack([log_dist(same, [0.5, 0.5], same), log_dist(same, [0.8, 0.2], same)])
    d = group_token_divergence(logps, torch.ones(2, 3))
    expected = (math.cosh(0.5 * math.log(1.6)) - 1) + (math.cosh(0.5 * math.log(0.4)) - 1)
    assert expected == pytest.approx(0.134537, abs=1e-6)
    torch.testing.assert_close(d, torch.tensor([0.0, expected], dtype=torch.float32).index_select(
        0, torch.tensor([0, 1, 0])), atol=1e-6, rtol=0)
    w = tw_grpo_token_weights(d.expand(2, 3), torch.ones(2, 3), 2, 1.7)
    # min 0 at t = 0, 2 → weight 1; max at t = 1 → 1 + 0.7·D/(D + 1e-8)
    torch.testing.assert_close(w[0], torch.tensor([1.0, 1.0 + 0.7 * expected / (expected + 1e-8), 1.0]))


def test_three_levels_of_divergence_map_linearly_into_one_to_alpha():
    # D = (0, 2, 4) at three positions: weights 1, 1 + α−1·½, α (the 1e-8 guard changes the 6th decimal only)
    d = torch.tensor([[0.0, 2.0, 4.0]]).expand(3, 3)
    w = tw_grpo_token_weights(d, torch.ones(3, 3), 3, 2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 2.0]]).expand(3, 3), atol=1e-6, rtol=0)
    # a constant non-zero D: all positions at the minimum, weight 1
    w = tw_grpo_token_weights(torch.full((2, 4), 3.0), torch.ones(2, 4), 2, 1.7)
    assert torch.equal(w, torch.ones(2, 4))


def test_weights_stay_in_one_to_alpha_and_match_the_official_loops():
    torch.manual_seed(0)
    g, t_len, vocab = 4, 6, 7
    logps = torch.log_softmax(torch.randn(g, t_len, vocab) * 2.0, dim=-1).double()
    mask = torch.ones(g, t_len)
    mask[1, 4:] = 0  # shorter members: padded tail enters as the uniform distribution
    mask[3, 2:] = 0
    d = group_token_divergence(logps, mask)
    w = tw_grpo_token_weights(d.expand(g, t_len), mask, g, 1.7)
    assert (w >= 1.0).all() and (w <= 1.7 + 1e-6).all()
    assert w.max() == pytest.approx(1.7, abs=1e-6) and w.min() == pytest.approx(1.0, abs=1e-6)
    # one group whose longest completion fills T: exactly the official function's setting
    official = official_loops(logps, mask, g, 1.7)
    torch.testing.assert_close((w * mask).double(), official, atol=1e-5, rtol=1e-5)


def test_padding_is_never_read():
    torch.manual_seed(1)
    logps = torch.log_softmax(torch.randn(2, 4, 5), dim=-1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    d = group_token_divergence(logps, mask)
    junk = logps.clone()
    junk[mask == 0] = float("nan")  # padded positions: garbage never enters
    torch.testing.assert_close(group_token_divergence(junk, mask), d)
    # the weights read D only before the group's longest completion (t < 3): NaN after it changes nothing
    div = d.expand(2, 4).clone()
    div[:, 3] = float("nan")
    w = tw_grpo_token_weights(div, mask, 2, 1.7)
    assert torch.isfinite(w).all() and (w[:, 3] == 1).all()
    torch.testing.assert_close(w[:, :3], tw_grpo_token_weights(d.expand(2, 4), mask, 2, 1.7)[:, :3])


def test_two_groups_are_normalised_separately_and_official_per_group():
    torch.manual_seed(2)
    logps = torch.log_softmax(torch.randn(4, 5, 6) * 3.0, dim=-1).double()
    mask = torch.ones(4, 5)
    mask[2:, 3:] = 0  # the second group is shorter than the batch (T = 5)
    d = torch.cat([group_token_divergence(logps[:2], mask[:2]).expand(2, 5),
                   group_token_divergence(logps[2:], mask[2:]).expand(2, 5)])
    w = tw_grpo_token_weights(d, mask, 2, 1.7)
    # group 0 fills T: official on the batch; group 1 alone at its own length (= the official run's one group per
    # device); the official on the whole batch would give group 1 min D = 0 from its all-padding positions
    torch.testing.assert_close((w[:2] * mask[:2]).double(), official_loops(logps[:2], mask[:2], 2, 1.7),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((w[2:, :3]).double(), official_loops(logps[2:, :3], mask[2:, :3], 2, 1.7),
                               atol=1e-5, rtol=1e-5)
    assert (w[2:, 3:] == 1).all()


def test_group_size_one_is_plain_grpo():
    logps = torch.log_softmax(torch.randn(3, 4, 5), dim=-1)
    mask = torch.ones(3, 4)
    d = torch.stack([group_token_divergence(logps[i:i + 1], mask[i:i + 1]) for i in range(3)])
    assert torch.equal(d, torch.zeros(3, 4))
    adv = torch.tensor([0.5, -1.0, 2.0])
    out = tw_grpo_token_advantages(adv, ctx_for(d, mask, 1), tw_grpo_alpha=1.7)
    assert torch.equal(out, adv[:, None].expand(3, 4))


def test_advantages_are_scaled_by_the_group_weights_and_nan_rewards_get_zero():
    d = torch.tensor([[0.0, 1.0, 2.0]] * 2 + [[5.0, 5.0, 1.0]] * 2)
    mask = torch.ones(4, 3)
    rewards = torch.tensor([1.0, 0.0, float("nan"), 1.0])
    adv = torch.tensor([1.0, -1.0, float("nan"), 0.5])
    out = tw_grpo_token_advantages(adv, ctx_for(d, mask, 2, rewards), tw_grpo_alpha=2.0)
    # group 0: weights 1, 1.5, 2; group 1: D = (5, 5, 1) → weights 2, 2, 1
    expected = torch.tensor([[1.0, 1.5, 2.0], [-1.0, -1.5, -2.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.5]])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_empty_group_and_inf_rewards():
    mask = torch.zeros(2, 3)  # two empty completions: no position is read, weights 1
    w = tw_grpo_token_weights(torch.zeros(2, 3), mask, 2, 1.7)
    assert torch.equal(w, torch.ones(2, 3))
    with pytest.raises(ValueError, match="inf"):
        tw_grpo_token_advantages(torch.zeros(2), ctx_for(torch.zeros(2, 3), torch.ones(2, 3), 2,
                                                        torch.tensor([1.0, float("inf")])))
    with pytest.raises(ValueError, match="intra_group_token_divergence"):
        tw_grpo_token_advantages(torch.zeros(2), TokenContext(completion_mask=torch.ones(2, 3), group_size=2))


def test_large_log_ratios_are_clamped_at_eleven():
    # p1 puts 1e-30 on token 1, p2 puts ½: δ = m − l = ½(log ½ − log 1e-30) ≈ 34 for member 1 → clamped to 11.
    logps = torch.stack([log_dist([1.0 - 1e-30, 1e-30]), log_dist([0.5, 0.5])]).double()
    d = group_token_divergence(logps, torch.ones(2, 1))
    l1, l2 = logps[0, 0].tolist(), logps[1, 0].tolist()
    total = 0.0
    for own in (l1, l2):
        for v in range(2):
            x = min(max((l1[v] + l2[v]) / 2 - own[v], -11.0), 11.0)
            total += math.exp(x) - x - 1
    assert d.item() == pytest.approx(total / 2, rel=1e-6)
    assert d.item() < math.exp(11.0)  # finite, bounded by the clamp


@pytest.mark.parametrize("alpha", [0.5, float("nan"), float("inf"), "2", True])
def test_bad_alpha_fails_at_config(tmp_path, alpha):
    with pytest.raises(ValueError, match="tw_grpo_alpha"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="tw_grpo",
                   tw_grpo_alpha=alpha)


def test_alpha_one_is_accepted():
    cfg = GRPOConfig(output_dir="/tmp/tw", use_cpu=True, bf16=False, token_weighting="tw_grpo", tw_grpo_alpha=1.0)
    assert cfg.tw_grpo_alpha == 1.0
