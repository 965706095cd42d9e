"""OTB (Optimal Token Baseline, token_weighting="otb") and the Σπ² helper; see the docstring of otb_token_advantages.

Hand-derived fixture: 2 groups × 3 rollouts × 4 tokens. Tokens are of two kinds, chosen so the Logit-Gradient
Proxy w = 1 − 2π + Σπ² is round: "a" = (π 0.5, Σπ² 0.5) → w = 0.5; "b" = (π 0.1, Σπ² 0.2) → w = 1.0 (both
reachable by a real softmax: π² ≤ Σπ² ≤ π² + (1−π)²). W = cumulative w over real tokens.

group 1, R = [1, 0, 1]
| row | R | mask    | w                 | W                 |
|  0  | 1 | 1 1 1 1 | .5  .5  1   1     | .5  1   2   3     |
|  1  | 0 | 1 1 0 0 | 1   1   -   -     | 1   2   -   -     |
|  2  | 1 | 1 1 1 0 | .5  1   .5  -     | .5  1.5 2   -     |
B_t = Σ R W / Σ W over the rows real at t:
t0: (.5 + 0 + .5)/(.5+1+.5) = 1/2      → A = +1/2, −1/2, +1/2
t1: (1 + 0 + 1.5)/(1+2+1.5) = 5/9      → A = +4/9, −5/9, +4/9
t2: (2 + 2)/(2 + 2) = 1                → A = 0 (rows 0, 2)
t3: row 0 alone: 3/(3 + 1e-8) ≈ 1      → A ≈ 0; with handle_zero_tail (row 0 uniquely longest, 4 > 3): B = 0, A = 1

group 2, R = [0, 0.5, NaN]
|  3  | 0  | 1 1 1 0 | 1   .5  .5  -     | 1   1.5 2   -     |
|  4  | .5 | 1 1 1 1 | .5  .5  .5  .5    | .5  1   1.5 2     |
|  5  | NaN| 1 1 0 0 | (junk: excluded)                       |
t0: (0 + .5·.5)/(1 + .5) = 1/6         → A = −1/6, +1/3
t1: (.5·1)/(1.5 + 1) = 1/5             → A = −1/5, +3/10
t2: (.5·1.5)/(2 + 1.5) = 3/14          → A = −3/14, +2/7
t3: row 4 alone ≈ .5 → A ≈ 0; with handle_zero_tail (scored lengths 3, 4, 0: row 4 uniquely longest): A = .5
"""

import math
from types import SimpleNamespace

import pytest
import torch

from trl_groupx.config import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import otb_token_advantages
from trl_groupx.token_weights.otb import logit_gradient_proxy
from trl_groupx.token_weights.sum_pi_squared import (
    per_token_logps_entropies_sum_pi_squared,
    sum_pi_squared_from_logits,
)

NAN = float("nan")
A_TOK, B_TOK = (0.5, 0.5), (0.1, 0.2)  # (π, Σπ²) → w = 0.5 and 1.0
J = (123.0, 1e6)  # junk at padding: must never be read
KINDS = [
    [A_TOK, A_TOK, B_TOK, B_TOK],
    [B_TOK, B_TOK, J, J],
    [A_TOK, B_TOK, A_TOK, J],
    [B_TOK, A_TOK, A_TOK, J],
    [A_TOK, A_TOK, A_TOK, A_TOK],
    [B_TOK, A_TOK, J, J],  # NaN-reward row
]
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
R = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, NAN])
PI = torch.tensor([[k[0] for k in row] for row in KINDS])
LOGPS = torch.log(PI)
S2 = torch.tensor([[k[1] for k in row] for row in KINDS])


def ctx_of(rewards=R, logps=LOGPS, s2=S2, mask=MASK, group_size=3):
    return TokenContext(completion_mask=mask, group_size=group_size, logps=logps, sum_pi_squared=s2, rewards=rewards,
                        entropies=torch.zeros_like(logps))


def run(handle_zero_tail=False, **kw):
    ctx = ctx_of(**kw)
    return otb_token_advantages(torch.zeros(ctx.completion_mask.shape[0]), ctx, otb_handle_zero_tail=handle_zero_tail)


EXPECTED = torch.tensor([
    [1 / 2, 4 / 9, 0.0, 0.0],
    [-1 / 2, -5 / 9, 0.0, 0.0],
    [1 / 2, 4 / 9, 0.0, 0.0],
    [-1 / 6, -1 / 5, -3 / 14, 0.0],
    [1 / 3, 3 / 10, 2 / 7, 0.0],
    [0.0, 0.0, 0.0, 0.0],
])


def test_hand_values():
    torch.testing.assert_close(run(), EXPECTED, atol=1e-6, rtol=0)


def test_hand_values_handle_zero_tail():
    expected = EXPECTED.clone()
    expected[0, 3], expected[4, 3] = 1.0, 0.5  # the uniquely longest rows' lone tails keep their full reward
    torch.testing.assert_close(run(handle_zero_tail=True), expected, atol=1e-6, rtol=0)


def test_padding_never_read_and_zero():
    logps, s2 = LOGPS.clone(), S2.clone()
    logps[MASK == 0], s2[MASK == 0] = NAN, float("inf")
    out = run(logps=logps, s2=s2)
    torch.testing.assert_close(out, run())
    assert (out[MASK == 0] == 0).all() and torch.isfinite(out).all()


def test_nan_reward_row_is_zero_and_excluded():
    logps, s2 = LOGPS.clone(), S2.clone()
    logps[5], s2[5] = -0.01, 0.99  # anything on the unscored row
    out = run(logps=logps, s2=s2)
    torch.testing.assert_close(out, run())
    assert (out[5] == 0).all()
    # same numbers as the group without row 5 at all (group 2 as a group of two plus an empty row)
    mask = MASK.clone()
    mask[5] = 0
    torch.testing.assert_close(run(mask=mask, rewards=torch.nan_to_num(R, nan=0.0)), out, atol=1e-7, rtol=0)


def test_inf_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="token_weighting='otb'.*inf"):
        run(rewards=torch.tensor([1.0, 0.0, float("inf"), 0.0, 0.5, 0.0]))


def test_missing_sum_pi_squared_is_a_clear_error():
    ctx = TokenContext(completion_mask=MASK, group_size=3, logps=LOGPS, rewards=R)
    with pytest.raises(ValueError, match="sum_pi_squared"):
        otb_token_advantages(torch.zeros(6), ctx)


def test_group_size_one_gets_no_baseline():
    # verl's N == 1 branch: A = return = R on every real token; NaN row still 0
    expected = torch.nan_to_num(R, nan=0.0)[:, None] * MASK
    torch.testing.assert_close(run(group_size=1), expected)


def test_group_size_two_hand_values():
    # rows (0, 1): t0 W = .5, 1 → B = (1·.5 + 0)/1.5 = 1/3 → A = 2/3, −1/3; t1 W = 1, 2 → B = 1/3 → same;
    # t2, t3: row 0 alone → ≈ 0. rows (2, 3): t0 W = .5, 1 → B = 1/3 → 2/3, −1/3; t1 W = 1.5, 1.5 → B = 1/2 →
    # ±1/2; t2 W = 2, 2 → ±1/2. rows (4, 5): row 5 NaN → row 4 alone ≈ 0.
    expected = torch.tensor([
        [2 / 3, 2 / 3, 0, 0], [-1 / 3, -1 / 3, 0, 0], [2 / 3, 1 / 2, 1 / 2, 0], [-1 / 3, -1 / 2, -1 / 2, 0],
        [0, 0, 0, 0], [0, 0, 0, 0],
    ])
    torch.testing.assert_close(run(group_size=2), expected, atol=1e-6, rtol=0)


def test_all_equal_rewards_give_zero():
    out = run(rewards=torch.full((6,), 0.7))
    assert out.abs().max() < 1e-6  # B = R·ΣW/(ΣW + 1e-8): zero up to the 1e-8 guard


def test_empty_completion():
    mask = MASK.clone()
    mask[1] = 0  # row 1 generated nothing: no tokens, no part in group 1's baselines
    out = run(mask=mask)
    assert (out[1] == 0).all() and torch.isfinite(out).all()
    # group 1 is then rows 0 and 2 with R = 1 both: all-equal → 0
    assert out[:3].abs().max() < 1e-6
    assert torch.isfinite(run(mask=torch.zeros_like(MASK))).all() and (run(mask=torch.zeros_like(MASK)) == 0).all()


def test_truncated_completion_is_just_shorter():
    # a completion cut at max length has mask 1 to the end: no special case, same formula (row 0 above)
    assert run()[0, 3].abs() < 1e-6 and run(handle_zero_tail=True)[0, 3] == pytest.approx(1.0)


def test_update_shrinks_inversely_with_own_cumulative_proxy():
    """Catalog check, part 2: A_{i,t} = S (R_i − B_{−i}) / (W_{i,t} + S), decreasing in the rollout's own W."""
    # two rows, one token each; other row: R = 0, w = 0.5 (S = 0.5, B_{−i} = 0); row i: R = 1, w varied via Σπ²
    values = []
    for w in (0.1, 0.3, 0.5, 0.9):
        pi_i = 0.5  # w = 1 − 2·0.5 + Σπ² = Σπ²
        ctx = TokenContext(completion_mask=torch.ones(2, 1), group_size=2,
                           logps=torch.log(torch.tensor([[pi_i], [0.5]])), sum_pi_squared=torch.tensor([[w], [0.5]]),
                           rewards=torch.tensor([1.0, 0.0]))
        a = otb_token_advantages(torch.zeros(2), ctx)[0, 0].item()
        assert a == pytest.approx(0.5 * 1.0 / (w + 0.5), abs=1e-6)
        values.append(a)
    assert values == sorted(values, reverse=True)


# --- official code, transcribed as a plain loop ------------------------------------------------------------------


def verl_otb_loop(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, handle_zero_tail=False,
                  epsilon=1e-8):
    """Plain-Python reading of volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7:verl/trainer/ppo/core_algos.py
    `compute_optimal_token_baseline_advantage` (l.758–873), without rollout IS weights. Written here from the
    formulas (reward-to-go, w, cumulative W over real tokens, per-position group baseline, N == 1 → none,
    handle_zero_tail), element by element."""
    n, t_len = len(response_mask), len(response_mask[0])
    returns = [[0.0] * t_len for _ in range(n)]
    w_cum = [[0.0] * t_len for _ in range(n)]
    for i in range(n):
        acc = 0.0
        for t in reversed(range(t_len)):
            acc += token_level_rewards[i][t] * response_mask[i][t]
            returns[i][t] = acc
        run_w = 0.0
        for t in range(t_len):
            w = 1.0 - 2.0 * math.exp(old_log_probs[i][t]) + sum_pi_squared[i][t]
            run_w += w * response_mask[i][t]
            w_cum[i][t] = run_w
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    baselines = [[0.0] * t_len for _ in range(n)]
    for members in groups.values():
        if len(members) == 1:
            continue
        for t in range(t_len):
            num = sum(returns[i][t] * w_cum[i][t] * response_mask[i][t] for i in members)
            den = sum(w_cum[i][t] * response_mask[i][t] for i in members) + epsilon
            for i in members:
                baselines[i][t] = num / den
        if handle_zero_tail:
            lengths = [sum(response_mask[i]) for i in members]
            ordered = sorted(lengths)
            longest, second = ordered[-1], ordered[-2]
            holders = [i for i, length in zip(members, lengths) if length == longest]
            if len(holders) == 1 and longest > second:
                for t in range(int(second), t_len):
                    baselines[holders[0]][t] = 0.0
    return [[(returns[i][t] - baselines[i][t]) * response_mask[i][t] for t in range(t_len)] for i in range(n)]


def random_fixture(seed, n, t_len, vocab=7, group_size=4, min_len=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t_len, vocab, generator=gen) * 2
    tokens = torch.randint(0, vocab, (n, t_len), generator=gen)
    logps = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    s2 = logits.softmax(-1).pow(2).sum(-1)
    lengths = torch.randint(min_len, t_len + 1, (n,), generator=gen)
    mask = (torch.arange(t_len)[None] < lengths[:, None]).long()
    rewards = torch.randint(0, 3, (n,), generator=gen).float() / 2
    return logps, s2, mask, rewards


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("group_size", [1, 2, 4])
@pytest.mark.parametrize("handle_zero_tail", [False, True])
def test_matches_verl_loop(seed, group_size, handle_zero_tail):
    n, t_len = 4 * group_size if group_size < 4 else 12, 7
    logps, s2, mask, rewards = random_fixture(seed, n, t_len, min_len=1)
    # verl's outcome reward: the score on the last real token of the completion
    token_rewards = torch.zeros(n, t_len)
    token_rewards[torch.arange(n), mask.sum(-1) - 1] = rewards
    index = [i // group_size for i in range(n)]
    expected = torch.tensor(verl_otb_loop(token_rewards.tolist(), mask.tolist(), index, logps.tolist(), s2.tolist(),
                                          handle_zero_tail=handle_zero_tail))
    out = run(rewards=rewards, logps=logps, s2=s2, mask=mask, group_size=group_size, handle_zero_tail=handle_zero_tail)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


# --- the Logit-Gradient Proxy and Σπ² --------------------------------------------------------------------------


def test_sum_pi_squared_formula_matches_softmax():
    torch.manual_seed(0)
    for scale in (0.1, 1.0, 10.0, 60.0):  # 60: exp(2z) would overflow float32 without the log-sum-exp form
        z = torch.randn(5, 9, 50) * scale
        direct = z.double().softmax(-1).pow(2).sum(-1).float()
        # float32 log-sum-exps of size ~|2z| carry a rounding of ~|2z|·6e-8 into the exponent: rtol scales with it
        torch.testing.assert_close(sum_pi_squared_from_logits(z), direct, atol=1e-6, rtol=max(1e-5, 4e-7 * scale))
    assert sum_pi_squared_from_logits(torch.zeros(1, 8)).item() == pytest.approx(1 / 8)  # uniform: V·(1/V)²


def test_proxy_equals_autograd_logit_gradient_norm():
    """Catalog check, part 1: 1 − 2π_y + Σπ² = ‖onehot(y) − softmax(z)‖² = ‖∂ log π_y / ∂z‖², by autograd."""
    torch.manual_seed(1)
    z = (torch.randn(16, 30) * 3).requires_grad_()
    y = torch.randint(0, 30, (16,))
    logp = z.log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)
    (grad,) = torch.autograd.grad(logp.sum(), z)  # rows are independent: row i's grad is ∂ logp_i / ∂z_i
    proxy = logit_gradient_proxy(logp.detach(), sum_pi_squared_from_logits(z.detach()))
    onehot = torch.nn.functional.one_hot(y, 30).float()
    torch.testing.assert_close(proxy, grad.pow(2).sum(-1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(proxy, (onehot - z.detach().softmax(-1)).pow(2).sum(-1), atol=1e-6, rtol=1e-5)


class FakeLM(torch.nn.Module):
    """Logits at position j depend on tokens j and j−1 (so an off-by-one in the alignment shows); honours
    `logits_to_keep` like transformers' models."""

    def __init__(self, vocab=11):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(vocab, vocab, generator=gen) * 2)
        self.b = torch.nn.Parameter(torch.randn(vocab, vocab, generator=gen))
        self.calls = []

    def forward(self, input_ids, attention_mask, logits_to_keep=0, use_cache=False, token_type_ids=None):
        self.calls.append(input_ids.shape[0])
        prev = torch.cat([input_ids[:, :1], input_ids[:, :-1]], dim=1)
        logits = self.a[input_ids] + self.b[prev]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def _fake_batch():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 11, (5, 9), generator=gen)
    attn = torch.ones(5, 9, dtype=torch.long)
    attn[1, 7:] = 0  # completion padding (last 4 columns are the completion)
    attn[3, 5:] = 0  # empty completion
    attn[2, :2] = 0  # left-padded prompt
    return ids, attn


def test_helper_matches_direct_computation():
    model, (ids, attn) = FakeLM(), _fake_batch()
    k, temp = 4, 0.7
    logps, ent, s2 = per_token_logps_entropies_sum_pi_squared(model, ids, attn, k, temperature=temp, batch_size=2)
    assert model.calls == [2, 2, 1]  # micro-batched
    full = model.a[ids] + model.b[torch.cat([ids[:, :1], ids[:, :-1]], dim=1)]
    z = full[:, -k - 1:-1].detach() / temp  # position j predicts token j+1
    logp_all = z.log_softmax(-1)
    keep = attn[:, -k:].bool()
    exp_logps = logp_all.gather(-1, ids[:, -k:, None]).squeeze(-1) * keep
    exp_ent = -(logp_all.exp() * logp_all).sum(-1) * keep
    exp_s2 = z.softmax(-1).pow(2).sum(-1) * keep
    for got, want in ((logps, exp_logps), (ent, exp_ent), (s2, exp_s2)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        assert (got[~keep] == 0).all() and not got.requires_grad
    # micro-batch size does not change anything
    again = per_token_logps_entropies_sum_pi_squared(model, ids, attn, k, temperature=temp, batch_size=5)
    for got, want in zip(again, (logps, ent, s2)):
        torch.testing.assert_close(got, want)


def test_helper_refuses_vision_inputs():
    model, (ids, attn) = FakeLM(), _fake_batch()
    with pytest.raises(ValueError, match="vision inputs.*pixel_values"):
        per_token_logps_entropies_sum_pi_squared(model, ids, attn, 4, temperature=1.0,
                                                 pixel_values=torch.zeros(5, 3))
    per_token_logps_entropies_sum_pi_squared(model, ids, attn, 4, temperature=1.0,  # row inputs are fine
                                             token_type_ids=torch.zeros_like(ids))


# --- config --------------------------------------------------------------------------------------------------------


def test_config_validation():
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="otb", otb_handle_zero_tail=True)
    with pytest.raises(ValueError, match="scale_rewards"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="otb", scale_rewards="none")
    with pytest.raises(ValueError, match="computes its own advantages"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="otb",
                   advantage_estimator="rloo")
    with pytest.raises(ValueError, match="otb_handle_zero_tail"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, otb_handle_zero_tail=True)  # variant off
