"""DCPO (token_weighting="dcpo"), hand-derived: A' = (1 − α)·A + α·b·ρ, α = a/(a+1),
a = min(|H0 − H|, cap)/q.

Fixture (N = 4, G = 2, T = 3; H0 = 0.5, cap = 0.1, θ = 0.05, temperatures [T_high, T_low]):

| row | r    | b | A    | mask  | p = π_old(y) | ρ at T_high      | ρ at T_low       |
|  0  | 1    | 1 | 0.5  | 1 1 1 | .5 .25 1     | 2, 1, 0.5        | 0.5, 1, 0.8      |
|  1  | 0    | 0 | −0.5 | 1 1 0 | .5 .5 (pad)  | (b = 0: unused)  |                  |
|  2  | 0.04 | 0 | −1   | 1 0 0 | .25 (pad)    | (b = 0: unused)  |                  |
|  3  | 1    | 1 | 1    | 1 1 1 | 1 1 .5       | 1, 1.5, 3        | 1, 0.5, 0.25     |

q = 2 successes / 4 scored = 0.5.

First batch (state empty, H = 0 ≤ H0 → T_high): a = min(0.5, 0.1)/0.5 = 0.2, α = 0.2/1.2 = 1/6.
  row 0: 5/6·0.5 + 1/6·[2, 1, 0.5] = [0.75, 7/12, 0.5];   row 1: 5/6·(−0.5) = −5/12 on its 2 tokens;
  row 2: −5/6 on its token;   row 3: 5/6 + 1/6·[1, 1.5, 3] = [1, 13/12, 4/3].
  H for the next batch = mean of −log p over the 9 real tokens = (3 ln2 + 2 ln2 + 2 ln2 + ln2)/9 = 8 ln2/9.
Second batch with H = 0.56 (> H0 → T_low): a = 0.06/0.5 = 0.12, α = 0.12/1.12 = 3/28.
  row 0: 25/28·0.5 + 3/28·[0.5, 1, 0.8] = [0.5, 31/56, 29.8/56];   row 3: 25/28 + 3/28·[1, 0.5, 0.25] =
  [1, 26.5/28, 25.75/28];   rows 1, 2: 25/28·A.
"""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import dcpo_token_advantages
from trl_groupx.token_weights.dcpo import dcpo_mixing_weight
from trl_groupx.token_weights.tempered_logps import logp_temperatures_field, per_token_logps_at_temperatures

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
P = torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.5, 1.0], [0.25, 1.0, 1.0], [1.0, 1.0, 0.5]])
LOGPS = P.log()
RHO_HIGH = torch.tensor([[2.0, 1.0, 0.5], [3.0, 3.0, 3.0], [3.0, 3.0, 3.0], [1.0, 1.5, 3.0]])
RHO_LOW = torch.tensor([[0.5, 1.0, 0.8], [0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [1.0, 0.5, 0.25]])
TEMPERED = torch.stack([LOGPS + RHO_HIGH.log(), LOGPS + RHO_LOW.log()], dim=-1)
A = torch.tensor([0.5, -0.5, -1.0, 1.0])
R = torch.tensor([1.0, 0.0, 0.04, 1.0])
DEFAULTS = dict(dcpo_entropy_target=0.5, dcpo_temperatures=[1.2, 0.8], dcpo_entropy_gap_cap=0.1,
                dcpo_success_threshold=0.05)
FIRST = torch.tensor([[0.75, 7 / 12, 0.5], [-5 / 12, -5 / 12, 0.0], [-5 / 6, 0.0, 0.0], [1.0, 13 / 12, 4 / 3]])
SECOND = torch.tensor([[0.5, 31 / 56, 29.8 / 56], [-25 / 56, -25 / 56, 0.0], [-25 / 28, 0.0, 0.0],
                       [1.0, 26.5 / 28, 25.75 / 28]])


def run(advantages=A, rewards=R, mask=MASK, logps=LOGPS, tempered=TEMPERED, group_size=2, state=None, **flags):
    ctx = TokenContext(mask, group_size, logps=logps, rewards=rewards, tempered_logps=tempered)
    state = {} if state is None else state
    return dcpo_token_advantages(advantages, ctx, **{**DEFAULTS, **flags}, state=state), state


def test_first_batch_hand_values_and_entropy_state():
    out, state = run()
    torch.testing.assert_close(out, FIRST)
    assert math.isclose(state["entropy"], 8 * math.log(2) / 9, rel_tol=1e-6)


def test_second_batch_uses_low_temperature_and_uncapped_gap():
    out, state = run(state={"entropy": 0.56})
    torch.testing.assert_close(out, SECOND)
    assert math.isclose(state["entropy"], 8 * math.log(2) / 9, rel_tol=1e-6)  # refreshed from this batch


def test_mixing_weight():
    assert dcpo_mixing_weight(0.0, 0.5, entropy_target=0.5, entropy_gap_cap=0.1) == pytest.approx(1 / 6)
    assert dcpo_mixing_weight(0.56, 0.5, entropy_target=0.5, entropy_gap_cap=0.1) == pytest.approx(3 / 28)
    assert dcpo_mixing_weight(0.5, 0.5, entropy_target=0.5, entropy_gap_cap=0.1) == 0.0  # on target: plain A
    assert dcpo_mixing_weight(0.0, 1.0, entropy_target=0.5, entropy_gap_cap=0.1) == pytest.approx(0.1 / 1.1)
    assert dcpo_mixing_weight(0.0, 0.0, entropy_target=0.5, entropy_gap_cap=0.1) == 0.0  # no success (official NaN)


def test_entropy_at_target_takes_high_temperature_and_gives_plain_advantages():
    out, _ = run(state={"entropy": 0.5})  # H ≤ H0 → T_high; |H0 − H| = 0 → α = 0
    torch.testing.assert_close(out, A[:, None] * MASK)


def test_no_success_gives_plain_advantages_instead_of_nan():
    out, state = run(rewards=torch.tensor([0.0, 0.05, 0.04, -1.0]))  # nothing strictly above θ = 0.05
    torch.testing.assert_close(out, A[:, None] * MASK)
    assert torch.isfinite(out).all() and "entropy" in state


def test_nan_rewards_excluded_from_q_and_get_zero():
    rewards = torch.tensor([1.0, float("nan"), 0.04, 1.0])
    adv = A.clone()
    out, _ = run(adv, rewards)
    # q = 2 successes / 3 scored → a = 0.1·3/2 = 0.15, α = 0.15/1.15 = 3/23
    alpha = 3 / 23
    assert (out[1] == 0).all()
    torch.testing.assert_close(out[0], (1 - alpha) * 0.5 + alpha * RHO_HIGH[0])
    torch.testing.assert_close(out[2], torch.tensor([-(1 - alpha), 0.0, 0.0]))
    # a NaN advantage (unscored upstream) also gives 0, but a NaN advantage with a real reward keeps b·ρ
    adv[3] = float("nan")
    out, _ = run(adv, rewards)
    torch.testing.assert_close(out[3], alpha * RHO_HIGH[3])


def test_all_equal_groups_and_group_sizes():
    # all-equal groups: A = 0, successful rows still get the target term α·ρ (as the official rewrite)
    out, _ = run(torch.zeros(4), torch.tensor([1.0, 1.0, 0.0, 0.0]), group_size=2)
    torch.testing.assert_close(out[:2], (1 / 6) * RHO_HIGH[:2] * MASK[:2])  # q = 0.5 → α = 1/6
    assert (out[2:] == 0).all()
    for g in (1, 2, 4):  # per-row rewrite: the group size only checks the layout
        torch.testing.assert_close(run(group_size=g)[0], FIRST)
    with pytest.raises(ValueError, match="groups of 3"):
        run(group_size=3)


def test_padding_never_read():
    for junk in (float("nan"), float("inf"), float("-inf"), 50.0):
        logps = torch.where(MASK.bool(), LOGPS, torch.full_like(LOGPS, junk))
        tempered = torch.where(MASK.bool()[..., None], TEMPERED, torch.full_like(TEMPERED, junk))
        out, state = run(logps=logps, tempered=tempered)
        torch.testing.assert_close(out, FIRST)
        assert (out[~MASK.bool()] == 0).all()
        assert math.isclose(state["entropy"], 8 * math.log(2) / 9, rel_tol=1e-6)


def test_empty_batch_keeps_entropy_state():
    empty = torch.zeros(4, 3, dtype=torch.long)
    out, state = run(mask=empty, state={"entropy": 0.3})
    assert torch.equal(out, torch.zeros(4, 3)) and state == {"entropy": 0.3}
    assert (run()[0][2, 1:] == 0).all()  # a short completion's padding


def test_inf_reward_and_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="token_weighting='dcpo'.*inf"):
        run(rewards=torch.tensor([1.0, float("inf"), 0.0, 0.0]))
    with pytest.raises(ValueError, match="expected 2"):
        run(tempered=TEMPERED[..., :1])
    with pytest.raises(ValueError, match=r"sequence advantages \(N,\)"):
        run(A[:, None].expand(4, 3))
    with pytest.raises(ValueError, match="tempered log-probs"):
        run(tempered=None)


def test_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="dcpo")
    GRPOConfig(**base)
    for flags, match in [
        (dict(dcpo_entropy_target=-0.1), "dcpo_entropy_target"),
        (dict(dcpo_entropy_target=float("nan")), "dcpo_entropy_target"),
        (dict(dcpo_temperatures=[1.2]), "dcpo_temperatures must be two"),
        (dict(dcpo_temperatures=[1.2, 0.0]), "dcpo_temperatures must be two"),
        (dict(dcpo_temperatures=[0.8, 1.2]), "swap them"),
        (dict(dcpo_entropy_gap_cap=0.0), "dcpo_entropy_gap_cap"),
        (dict(dcpo_success_threshold=float("inf")), "dcpo_success_threshold"),
    ]:
        with pytest.raises(ValueError, match=match):
            GRPOConfig(**base, **flags)
    with pytest.raises(ValueError, match="dcpo_entropy_target"):  # a DCPO field while DCPO is off
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, dcpo_entropy_target=0.3)


def test_temperatures_field_convention():
    assert logp_temperatures_field(("dcpo_entropy_target", "dcpo_temperatures")) == "dcpo_temperatures"
    with pytest.raises(ValueError, match="exactly one"):
        logp_temperatures_field(("dcpo_entropy_target",))


def test_logps_at_temperatures_on_a_toy_model():
    """One forward gives log-probs at TRL's temperature and at each listed temperature of the same raw logits."""

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(6, 6)

        def forward(self, input_ids, attention_mask, logits_to_keep, use_cache):
            return type("Out", (), {"logits": self.emb(input_ids) * 3})()

    torch.manual_seed(0)
    model = Toy()
    ids = torch.tensor([[1, 2, 3, 4, 5], [2, 2, 1, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    logps, ent, tempered = per_token_logps_at_temperatures(model, ids, attn, 3, temperature=0.7,
                                                           temperatures=[1.2, 0.8], batch_size=1)
    z = (model.emb(ids) * 3).detach()[:, 1:4]  # logits predicting the 3 completion tokens
    labels = ids[:, 2:][..., None]
    keep = attn[:, 2:].bool()
    for t, got in ((0.7, logps), (1.2, tempered[..., 0]), (0.8, tempered[..., 1])):
        want = (z / t).log_softmax(-1).gather(-1, labels).squeeze(-1)
        torch.testing.assert_close(got, want * keep)
    p = (z / 0.7).softmax(-1)
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1) * keep)
    with pytest.raises(ValueError, match="finite and positive"):
        per_token_logps_at_temperatures(model, ids, attn, 3, temperature=1.0, temperatures=[0.0])


# --- official code, transcribed as a plain loop ------------------------------------------------------------------


def official_dcpo_step(entropy, scores, advantages, old_log_probs, tempered_log_probs, response_mask,
                       entropy_base=0.5):
    """Plain-Python reading of 597358816/DCPO@33f8073e302db6cc04a1e064df89242ba8f236b0:verl/trainer/ray_trainer.py,
    `RayPPOTrainer.fit` branch `alg == "DCPO"` l.813-836, one batch: `entropy` is the trainer's running variable
    (0 at l.730). `tempered_log_probs[T]` stands for `_compute_old_log_probs(batch, temperature=T)` (l.822). The
    advantages arrive as EasyR1's GRPO returns (`score · response_mask`, core_algos l.138-175). Returns the rewritten
    (B, L) advantages and the next `entropy`: `actor/entropy_loss` = −masked_mean(log_probs) of the update's
    forward (dp_actor l.322), here one micro-batch under the unchanged policy (on-policy, one optimizer step)."""
    temperature = 1.2 if entropy <= entropy_base else 0.8
    entropy_delta = entropy_base - entropy
    bool_reward = [s > 0.05 for s in scores]  # _compute_bool_reward_by_score(threshold=0.05, absolute=False)
    true_ratio = sum(bool_reward) / len(scores)
    alpha = min(abs(entropy_delta), 0.1)
    alpha = alpha / true_ratio if true_ratio else math.nan  # a tensor 0 division: inf (or nan), then nan below
    alpha = alpha / (alpha + 1) if not math.isnan(alpha) else math.nan
    n, t_len = len(scores), len(response_mask[0])
    out = [[0.0] * t_len for _ in range(n)]
    nll, count = 0.0, 0
    for i in range(n):
        for t in range(t_len):
            factor = math.exp(tempered_log_probs[temperature][i][t] - old_log_probs[i][t])
            out[i][t] = (1 - alpha) * advantages[i][t] + alpha * float(bool_reward[i]) * factor
            if response_mask[i][t]:
                nll -= old_log_probs[i][t]
                count += 1
    return out, nll / count


def random_batch(seed, n=8, t_len=6, vocab=9):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t_len, vocab, generator=gen) * 1.5
    tokens = torch.randint(0, vocab, (n, t_len), generator=gen)

    def logp(temp):
        return (logits / temp).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)

    lengths = torch.randint(1, t_len + 1, (n,), generator=gen)
    mask = (torch.arange(t_len)[None] < lengths[:, None]).long()
    scores = torch.randint(0, 2, (n,), generator=gen).float()
    adv = torch.randn(n, generator=gen)
    return logp(1.0), {1.2: logp(1.2), 0.8: logp(0.8)}, mask, scores, adv


# The fixture's batch entropies are 3.19, 3.04, 2.31, 3.03: H0 = 3.0 sees both temperatures and both a capped and
# an uncapped gap; 0.5 and 0.25 (script and paper) always the low temperature and the cap.
@pytest.mark.parametrize("entropy_base", [0.5, 0.25, 3.0])
def test_matches_official_branch_over_several_steps(entropy_base):
    """Four batches in a row: the temperature choice, α (capped and uncapped) and the entropy state carried from
    batch to batch all follow the transcription; tokens compared on the real positions (padding is free there)."""
    entropy, state = 0.0, {}
    for step in range(4):
        logps, tempered, mask, scores, adv = random_batch(step)
        if not scores.any():
            scores[0] = 1.0
        expected, entropy = official_dcpo_step(entropy, scores.tolist(), (adv[:, None] * mask).tolist(),
                                               logps.tolist(), {k: v.tolist() for k, v in tempered.items()},
                                               mask.tolist(), entropy_base)
        out, _ = run(adv, scores, mask, logps, torch.stack([tempered[1.2], tempered[0.8]], -1), group_size=4,
                     state=state, dcpo_entropy_target=entropy_base)
        torch.testing.assert_close(out, torch.tensor(expected) * mask, atol=1e-5, rtol=1e-5)
        assert math.isclose(state["entropy"], entropy, rel_tol=1e-6)


def test_official_branch_is_nan_without_success_and_ours_is_not():
    logps, tempered, mask, _, adv = random_batch(0)
    scores = torch.zeros(8)
    expected, _ = official_dcpo_step(0.0, scores.tolist(), (adv[:, None] * mask).tolist(), logps.tolist(),
                                     {k: v.tolist() for k, v in tempered.items()}, mask.tolist())
    assert all(math.isnan(v) for row in expected for v in row)
    out, _ = run(adv, scores, mask, logps, torch.stack([tempered[1.2], tempered[0.8]], -1), group_size=4)
    torch.testing.assert_close(out, adv[:, None] * mask)
