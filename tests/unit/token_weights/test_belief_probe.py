"""GRPO-VPS belief probing: hand-derived segment progress and token advantages (RMS / z-score / raw, prob / logprob,
sign clipping), λ = 0 and flat belief → GRPO, entropy and delimiter cut points on hand tensors, boundaries and segment
ids (empty, EOS-only, truncated completions), NaN / ±inf rewards, group sizes 1 and 2, padding never read, the probe
forward against unpadded forwards of the tiny model, and the flag refusals."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import belief_probe_token_advantages
from trl_groupx.token_weights.belief_probe import (
    completion_boundaries,
    delimiter_cut_points,
    entropy_cut_points,
    segment_ids_from_boundaries,
)
from trl_groupx.token_weights.belief_probe_forward import probe_answer_logps, reference_answer
from trl_groupx.toy import load_tiny_model

DEFAULTS = dict(belief_probe_coef=0.5, belief_probe_belief="prob", belief_probe_normalization="group_rms",
                belief_probe_sign="free")
L = math.log
NAN = float("nan")

# One group of two rollouts, K = 3 (4 boundary slots).
#   row 0: 3 segments, tokens 0 | 1 2 | 3 4, beliefs P = 0.1, 0.1, 0.5, 0.6  → ΔP = 0, 0.4, 0.1
#   row 1: 2 segments, tokens 0 1 | 2 3, beliefs P = 0.1, 0.3, 0.2          → ΔP = 0.2, −0.1
SEGMENTS = torch.tensor([[0, 1, 1, 2, 2, -1], [0, 0, 1, 1, -1, -1]])
MASK = (SEGMENTS >= 0).float()
BELIEF = torch.tensor([[L(0.1), L(0.1), L(0.5), L(0.6)], [L(0.1), L(0.3), L(0.2), NAN]])
# group RMS over the five ΔP: sqrt((0 + 0.16 + 0.01 + 0.04 + 0.01) / 5) = sqrt(0.044)
RMS = math.sqrt(0.044)


def ctx(segments=SEGMENTS, belief=BELIEF, rewards=None, group_size=2, mask=None):
    mask = (segments >= 0).float() if mask is None else mask
    n, t = segments.shape
    return TokenContext(mask, group_size, entropies=torch.zeros(n, t), logps=torch.zeros(n, t),
                        rewards=torch.zeros(n) if rewards is None else rewards, belief_segment_ids=segments,
                        answer_belief_logps=belief)


def per_token(per_segment_rows, segments=SEGMENTS):
    out = torch.zeros(segments.shape)
    for i, values in enumerate(per_segment_rows):
        for t, j in enumerate(segments[i].tolist()):
            if j >= 0:
                out[i, t] = values[j]
    return out


def test_hand_derived_segment_progress_group_rms():
    got = belief_probe_token_advantages(torch.tensor([1.0, -1.0]), ctx(), **DEFAULTS)
    # A_{i,j} = A_i + 0.5 · ΔP_{i,j} / RMS
    expected = per_token([[1.0, 1.0 + 0.5 * 0.4 / RMS, 1.0 + 0.5 * 0.1 / RMS],
                          [-1.0 + 0.5 * 0.2 / RMS, -1.0 - 0.5 * 0.1 / RMS]])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    # the segment that raised the belief most (row 0, segment 1) has the largest credit
    assert got[0, 1] == got.max() and got[0, 0] == 1.0


def test_group_zscore_and_raw_and_logprob():
    # z-score: mean ΔP = (0 + 0.4 + 0.1 + 0.2 − 0.1) / 5 = 0.12; centred −0.12, 0.28, −0.02, 0.08, −0.22;
    # population std = sqrt((0.0144 + 0.0784 + 0.0004 + 0.0064 + 0.0484) / 5) = sqrt(0.0296)
    std = math.sqrt(0.0296)
    got = belief_probe_token_advantages(torch.zeros(2), ctx(), **{**DEFAULTS, "belief_probe_normalization":
                                                                 "group_zscore", "belief_probe_coef": 1.0})
    expected = per_token([[-0.12 / std, 0.28 / std, -0.02 / std], [0.08 / std, -0.22 / std]])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    raw = belief_probe_token_advantages(torch.zeros(2), ctx(), **{**DEFAULTS, "belief_probe_normalization": "none",
                                                                  "belief_probe_coef": 2.0})
    torch.testing.assert_close(raw, per_token([[0.0, 0.8, 0.2], [0.4, -0.2]]), atol=1e-6, rtol=0)
    # logprob: Δ log P = 0, log 5, log 1.2 | log 3, log(2/3)
    lp = belief_probe_token_advantages(torch.zeros(2), ctx(), **{**DEFAULTS, "belief_probe_normalization": "none",
                                                                 "belief_probe_coef": 1.0, "belief_probe_belief":
                                                                 "logprob"})
    torch.testing.assert_close(lp, per_token([[0.0, L(5), L(1.2)], [L(3), L(2 / 3)]]), atol=1e-5, rtol=0)


def test_outcome_sign_clips_tokens_that_oppose_the_rollout_outcome():
    flags = {**DEFAULTS, "belief_probe_coef": 2.0, "belief_probe_sign": "outcome"}
    got = belief_probe_token_advantages(torch.tensor([1.0, -1.0]), ctx(), **flags)
    # free: row 1 segment 0 = −1 + 2·0.2/RMS = 0.907 > 0 opposes A = −1 → clipped to 0
    free = belief_probe_token_advantages(torch.tensor([1.0, -1.0]), ctx(), **{**flags, "belief_probe_sign": "free"})
    assert free[1, 0] > 0.9 and got[1, 0] == 0.0 and got[1, 1] == 0.0
    torch.testing.assert_close(got[1, 2:4], free[1, 2:4])
    torch.testing.assert_close(got[0], free[0])  # row 0 (A > 0) has no negative token to clip


def test_lambda_zero_and_flat_belief_give_grpo():
    adv = torch.tensor([0.7, -0.7])
    grpo = adv[:, None] * MASK
    for norm in ("group_rms", "group_zscore", "none"):
        got = belief_probe_token_advantages(adv, ctx(), **{**DEFAULTS, "belief_probe_coef": 0.0,
                                                           "belief_probe_normalization": norm})
        assert torch.equal(got, grpo)
    flat = torch.tensor([[L(0.3)] * 4, [L(0.3)] * 3 + [NAN]])
    for norm in ("group_rms", "group_zscore", "none"):
        got = belief_probe_token_advantages(adv, ctx(belief=flat), **{**DEFAULTS, "belief_probe_coef": 3.0,
                                                                      "belief_probe_normalization": norm})
        assert torch.equal(got, grpo)


def test_all_equal_group_gets_the_process_signal_only():
    # A = 0 (all-equal group): the tokens carry λ·Δ̂ alone
    got = belief_probe_token_advantages(torch.zeros(2), ctx(), **DEFAULTS)
    expected = per_token([[0.0, 0.5 * 0.4 / RMS, 0.5 * 0.1 / RMS], [0.5 * 0.2 / RMS, -0.5 * 0.1 / RMS]])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_nan_reward_gets_zero_and_leaves_the_statistics():
    # row 1 unscored: 0 everywhere; row 0's RMS over its own ΔP = sqrt((0 + 0.16 + 0.01) / 3)
    got = belief_probe_token_advantages(torch.tensor([1.0, NAN]), ctx(rewards=torch.tensor([1.0, NAN])), **DEFAULTS)
    rms = math.sqrt(0.17 / 3)
    torch.testing.assert_close(got[0], per_token([[1.0, 1.0 + 0.5 * 0.4 / rms, 1.0 + 0.5 * 0.1 / rms]])[0],
                               atol=1e-6, rtol=0)
    assert (got[1] == 0).all()


def test_inf_reward_is_an_error():
    with pytest.raises(ValueError, match="±inf"):
        belief_probe_token_advantages(torch.zeros(2), ctx(rewards=torch.tensor([math.inf, 0.0])), **DEFAULTS)


def test_group_sizes_one_and_two():
    # G = 1: each row is its own group; row 1 alone: RMS = sqrt((0.04 + 0.01) / 2)
    got = belief_probe_token_advantages(torch.zeros(2), ctx(group_size=1), **DEFAULTS)
    rms1 = math.sqrt(0.05 / 2)
    torch.testing.assert_close(got[1, :4], torch.tensor([0.1 / rms1, 0.1 / rms1, -0.05 / rms1, -0.05 / rms1]),
                               atol=1e-6, rtol=0)
    # G = 2 with two groups: each is normalised on its own, so a copy of the group gets the same advantages
    segments = torch.cat([SEGMENTS, SEGMENTS])
    belief = torch.cat([BELIEF, BELIEF])
    got2 = belief_probe_token_advantages(torch.zeros(4), ctx(segments, belief), **DEFAULTS)
    torch.testing.assert_close(got2[:2], got2[2:])
    with pytest.raises(ValueError, match="do not split into groups"):
        belief_probe_token_advantages(torch.zeros(3), ctx(segments[:3], belief[:3]), **DEFAULTS)


def test_empty_completion_and_padding_never_read():
    segments = torch.cat([SEGMENTS, torch.full((2, 6), -1)])
    belief = torch.cat([BELIEF, torch.full((2, 4), NAN)])
    clean = belief_probe_token_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]), ctx(segments, belief), **DEFAULTS)
    assert (clean[2:] == 0).all()  # empty completions: no token, no advantage
    # garbage past every row's last boundary and on padding tokens' segment ids is never read
    dirty_belief = belief.clone()
    dirty_belief[1, 3] = 1e6
    dirty_belief[2:] = -123.0
    dirty_segments = segments.clone()
    dirty_segments[0, 5] = 2  # a padding token naming a segment
    mask = (segments >= 0).float()
    dirty = belief_probe_token_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]),
                                          ctx(dirty_segments, dirty_belief, mask=mask), **DEFAULTS)
    assert torch.equal(clean, dirty)
    assert torch.isfinite(dirty).all() and (dirty[mask == 0] == 0).all()


def test_rows_without_probes_keep_grpo():
    # an evaluation batch (not probed): segment ids −1, beliefs NaN → the incoming advantage on every real token
    segments = torch.full((2, 6), -1)
    mask = MASK
    got = belief_probe_token_advantages(torch.tensor([0.3, -0.3]), ctx(segments, torch.full((2, 4), NAN), mask=mask),
                                        **DEFAULTS)
    assert torch.equal(got, torch.tensor([0.3, -0.3])[:, None] * mask)


# --- cut points, boundaries, segment ids --------------------------------------------------------------------------


def test_entropy_cut_points_on_a_hand_tensor():
    ent = torch.tensor([5.0, 0.1, 2.0, 0.3, 2.0, 1.5, 0.2, 100.0, 100.0])  # last two: padding, never read
    # length 7, K = 3, q = 0.5: m = min(2, ⌊3.5⌋, 6) = 2; candidates 1..6 = [.1, 2, .3, 2, 1.5, .2]: top two 2 and 4
    assert entropy_cut_points(ent, 7, 3, 0.5) == [2, 4]
    assert entropy_cut_points(ent, 7, 8, 0.5) == [2, 4, 5]  # m = min(7, 3, 6) = 3
    assert entropy_cut_points(ent, 7, 2, 0.5) == [2]  # one cut; tie 2.0/2.0 → the earlier token
    assert entropy_cut_points(ent, 7, 8, 0.1) == []  # ⌊0.7⌋ = 0
    assert entropy_cut_points(ent, 7, 1, 1.0) == []  # K = 1: the whole completion is one segment
    assert entropy_cut_points(ent, 1, 8, 1.0) == []  # one token: nothing to cut
    assert 0 not in entropy_cut_points(ent, 7, 8, 1.0)  # token 0's entropy (5.0) never opens a segment


def test_delimiter_cut_points():
    texts = ["a", "\n", "\n", "b", "\n\n", "c", "d"]
    # "a\n\nb\n\ncd": "\n\n" ends in token 2 (cut 3) and in token 4 (cut 5)
    assert delimiter_cut_points(texts, 7, 8, "\n\n") == [3, 5]
    assert delimiter_cut_points(texts, 7, 2, "\n\n") == [3]  # the first K − 1
    assert delimiter_cut_points(texts, 5, 8, "\n\n") == [3]  # a delimiter in the last token cuts nothing
    assert delimiter_cut_points(texts, 7, 8, "###") == []


def test_boundaries_and_segment_ids():
    assert completion_boundaries(5, True, [2, 3]) == [0, 2, 3, 4]  # EOS at 4 is not part of the probed prefix
    assert completion_boundaries(5, False, [2]) == [0, 2, 5]  # truncated: the last boundary is the last token
    assert completion_boundaries(0, False, []) == []  # empty completion: no probe
    assert completion_boundaries(1, True, []) == [0, 0]  # EOS only: one segment of no progress
    assert segment_ids_from_boundaries([0, 2, 3, 4], 5, 7).tolist() == [0, 0, 1, 2, 2, -1, -1]
    assert segment_ids_from_boundaries([0, 2, 5], 5, 6).tolist() == [0, 0, 1, 1, 1, -1]
    assert segment_ids_from_boundaries([0, 0], 1, 3).tolist() == [0, -1, -1]
    assert segment_ids_from_boundaries([], 0, 3).tolist() == [-1, -1, -1]


def test_reference_answer_refuses_blank():
    assert reference_answer({"solution": 25}, "solution") == "25"
    for bad in ({"solution": None}, {"solution": "  "}, {}):
        with pytest.raises(ValueError, match="belief_probe_answer_column='solution'"):
            reference_answer(bad, "solution")


# --- the probe forward ----------------------------------------------------------------------------------------------


class CountingModel(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, **kwargs):
        self.calls += 1
        return self.model(**kwargs)


def test_probe_forward_equals_unpadded_forwards_and_counts_forwards():
    model = CountingModel(load_tiny_model().eval())
    sequences = [[1, 101, 4, 23, 24, 35, 25, 26], [1, 4, 23, 25], [1, 101, 4, 24, 25, 30, 31, 32, 33, 26, 27]]
    answers = [2, 1, 3]
    got = probe_answer_logps(model, sequences, answers, pad_token_id=0, temperature=0.7, chunk_size=2)
    assert model.calls == 2  # ⌈3 / 2⌉ chunks
    for seq, a, value in zip(sequences, answers, got, strict=True):
        ids = torch.tensor([seq])
        with torch.no_grad():
            logits = model.model(input_ids=ids).logits[0, :-1] / 0.7
        logps = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        torch.testing.assert_close(value, logps[-a:].sum(), atol=1e-5, rtol=1e-5)
    model.calls = 0
    probe_answer_logps(model, sequences, answers, pad_token_id=0, temperature=1.0, chunk_size=2, min_forwards=5)
    assert model.calls == 5  # 2 real + 3 discarded: as many forwards as the busiest process
    model.calls = 0
    assert probe_answer_logps(model, [], [], pad_token_id=0, temperature=1.0, chunk_size=2).numel() == 0
    assert model.calls == 0


# --- flags ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    ({"belief_probe_coef": -0.1}, "belief_probe_coef must be a finite number >= 0"),
    ({"belief_probe_coef": float("nan")}, "belief_probe_coef must be a finite number >= 0"),
    ({"belief_probe_max_segments": 0}, "belief_probe_max_segments must be an integer >= 1"),
    ({"belief_probe_max_segments": 2.5}, "belief_probe_max_segments must be an integer >= 1"),
    ({"belief_probe_entropy_top_fraction": 0.0}, "belief_probe_entropy_top_fraction must lie in"),
    ({"belief_probe_entropy_top_fraction": 1.5}, "belief_probe_entropy_top_fraction must lie in"),
    ({"belief_probe_segmentation": "fixed"}, "belief_probe_segmentation must be one of"),
    ({"belief_probe_segmentation": "delimiter", "belief_probe_delimiter": ""}, "needs a non-empty belief_probe_delim"),
    ({"belief_probe_answer_template": "The answer is"}, "must contain '{answer}' exactly once"),
    ({"belief_probe_answer_column": ""}, "belief_probe_answer_column must name the dataset column"),
    ({"belief_probe_belief": "odds"}, "belief_probe_belief must be one of"),
    ({"belief_probe_normalization": "batch"}, "belief_probe_normalization must be one of"),
    ({"belief_probe_sign": "positive"}, "belief_probe_sign must be one of"),
])
def test_bad_flags_fail_at_config_construction(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="belief_probe",
                              **flags)


def test_flags_without_the_variant_are_refused(tmp_path):
    with pytest.raises(ValueError, match="belief_probe_coef"):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, belief_probe_coef=1.0)
