"""SPO-chain (`token_weighting="spo_segment"`): cut points, chain segment advantages, probability mask, whitening,
edge cases and config errors, against hand-derived numbers and an oracle written from the official code."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import TokenContext
from trl_groupx.registry import get_variant
from trl_groupx.token_weights.spo_segment import (
    cut_points,
    masked_whiten,
    segment_advantages,
    spo_segment_token_advantages,
)

NAN = float("nan")
THRESHOLD = 0.9


def logps_of(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def run(probs, mask, values, rewards, group_size, threshold=THRESHOLD):
    ctx = TokenContext(completion_mask=torch.tensor(mask, dtype=torch.float32), group_size=group_size,
                       logps=logps_of(probs).float(), rewards=torch.tensor(rewards, dtype=torch.float32),
                       segment_mc_values=torch.tensor(values, dtype=torch.float32))
    return spo_segment_token_advantages(torch.zeros(len(rewards)), ctx, spo_segment_prob_threshold=threshold)


# --- cut points ---------------------------------------------------------------------------------------------------

PROBS = [0.5, 0.95, 0.8, 0.99, 0.3, 0.7, 0.85, 0.2, 0.95, 0.1, 0.6, 0.4]


def test_cut_points_hand_computed():
    # p < 0.9 at L = [0, 2, 4, 5, 6, 7, 9, 10, 11]
    # interval 2: L[::2] = [0, 4, 6, 9, 11]; 0 is the root (valued by the group) → [4, 6, 9, 11]
    assert cut_points(logps_of(PROBS), 12, 0.9, 2) == [4, 6, 9, 11]
    # interval 5 (official default): L[::5] = [0, 7] → [7] (official cutpoints [-1, 6]: query y[:7])
    assert cut_points(logps_of(PROBS), 12, 0.9, 5) == [7]
    # interval 1: every low-probability token but the first
    assert cut_points(logps_of(PROBS), 12, 0.9, 1) == [2, 4, 5, 6, 7, 9, 10, 11]
    # max_cut_points keeps the first ones
    assert cut_points(logps_of(PROBS), 12, 0.9, 2, max_cut_points=2) == [4, 6]
    # threshold 0.5: p < 0.5 at [4, 7, 9, 11] → interval 2: [4, 9]
    assert cut_points(logps_of(PROBS), 12, 0.5, 2) == [4, 9]


def test_cut_points_read_only_the_real_tokens():
    # length 6: L = [0, 2, 4, 5] → [::2] = [0, 4] → [4]; the low probabilities after token 5 (padding) are not read
    padded = logps_of(PROBS[:6] + [0.01] * 6)
    assert cut_points(padded, 6, 0.9, 2) == [4]
    garbage = torch.cat([logps_of(PROBS[:6]), torch.full((6,), NAN, dtype=torch.float64)])
    assert cut_points(garbage, 6, 0.9, 2) == [4]
    assert cut_points(padded, 0, 0.9, 2) == []  # empty completion
    assert cut_points(logps_of([0.95, 0.99, 0.97]), 3, 0.9, 1) == []  # confident completion: no cut


# --- segment advantages -------------------------------------------------------------------------------------------


def test_segment_advantages_hand_computed_and_padding_never_read():
    # n = 6 real tokens, cuts at 2 (V = 0.4) and 4 (V = 0.9), V(root) = 0.5, R = 1:
    # tokens 0-1: 0.4 - 0.5 = -0.1; tokens 2-3: 0.9 - 0.4 = 0.5; tokens 4-5: 1 - 0.9 = 0.1; padding 0
    values = torch.tensor([[7.0, NAN, 0.4, NAN, 0.9, NAN, 7.0, -7.0]])  # 7s: position 0 and padding, never read
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    out = segment_advantages(values, mask, torch.tensor([0.5]), torch.tensor([1.0]))
    torch.testing.assert_close(out, torch.tensor([[-0.1, -0.1, 0.5, 0.5, 0.1, 0.1, 0.0, 0.0]], dtype=torch.float64))


def test_segment_advantages_telescope_to_reward_minus_root():
    gen = torch.Generator().manual_seed(0)
    n, t = 16, 12
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    values = torch.where(torch.rand(n, t, generator=gen) < 0.3, torch.rand(n, t, generator=gen),
                         torch.full((n, t), NAN))
    root, rewards = torch.rand(n, generator=gen), torch.rand(n, generator=gen)
    out = segment_advantages(values, mask, root, rewards)
    for i in range(n):
        length = int(lengths[i])
        if length == 0:
            assert (out[i] == 0).all()
            continue
        starts = [0] + [j for j in range(1, length) if not math.isnan(values[i, j])]
        # one advantage per segment (constant within it), summed over segments: R - V(root)
        for a, b in zip(starts, starts[1:] + [length]):
            assert torch.allclose(out[i, a:b], out[i, a].expand(b - a))
        total = sum(float(out[i, s]) for s in starts)
        assert total == pytest.approx(float(rewards[i] - root[i]), abs=1e-9)


def official_token_advantages(score, cutpoints, cut_values, probs):
    """Oracle written from `_compute_token_advantages` (AIFrameResearch/SPO@b9fc6a2, l.392-439): official cutpoints
    `c = j - 1` (a cutpoint -1, the prompt, becomes the base), value at each cutpoint, `score` at the last token,
    advantage at a valued token = value − previous value (0 without a base), filled backwards, `p > 0.9 → 0`."""
    n = len(probs)
    token_values = [None] * n
    advantages = [None] * n
    token_values[-1] = score
    base = None
    if cutpoints and cutpoints[0] == -1:
        base, cutpoints, cut_values = cut_values[0], cutpoints[1:], cut_values[1:]
    for c, v in zip(cutpoints, cut_values):
        token_values[c] = v
    for i in range(n):
        if token_values[i] is not None:
            advantages[i] = 0 if base is None else token_values[i] - base
            base = token_values[i]
    for i in range(n - 1, -1, -1):
        if advantages[i] is None:
            advantages[i] = advantages[i + 1]
    return [0 if p > 0.9 else a for a, p in zip(advantages, probs)]


@pytest.mark.parametrize("first_token_low", [True, False])
def test_masked_advantages_match_the_official_code(first_token_low):
    probs = list(PROBS) if first_token_low else [0.95] + PROBS[1:]
    cuts = cut_points(logps_of(probs), 12, 0.9, 2)
    cut_value = {j: 0.1 * (k + 1) for k, j in enumerate(cuts)}
    root, reward = 0.45, 1.0
    values = torch.full((1, 12), NAN)
    for j, v in cut_value.items():
        values[0, j] = v
    ours = segment_advantages(values, torch.ones(1, 12), torch.tensor([root]), torch.tensor([reward]))[0]
    ours = torch.where(torch.tensor(probs) < 0.9, ours, torch.zeros_like(ours))
    # the official cutpoints are j - 1 (the prompt, -1, when token 0 is low), its root value the MC estimate
    official_cuts = ([-1] if first_token_low else []) + [j - 1 for j in cuts]
    official_values = ([root] if first_token_low else []) + [cut_value[j] for j in cuts]
    expected = official_token_advantages(reward, official_cuts, official_values, probs)
    torch.testing.assert_close(ours, torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)


# --- whitening ------------------------------------------------------------------------------------------------------


def test_masked_whiten_matches_the_official_formula():
    values = torch.tensor([1.0, 2.0, 4.0, 100.0], dtype=torch.float64)
    mask = torch.tensor([True, True, True, False])
    # mean 7/3, unbiased var ((4/3)² + (1/3)² + (5/3)²) / 2 = (42/9) / 2 = 7/3
    mean, var = 7 / 3, 7 / 3
    expected = (values - mean) / math.sqrt(var + 1e-8)
    torch.testing.assert_close(masked_whiten(values, mask, torch.ones(4, dtype=torch.bool)), expected)
    # an empty mask falls back to the other mask (official: `mask_bak`)
    fallback = masked_whiten(values, torch.zeros(4, dtype=torch.bool), mask)
    torch.testing.assert_close(fallback, expected)
    # one entry: variance 0 (choice), no entry: zeros
    one = masked_whiten(values, torch.tensor([False, True, False, False]), mask)
    torch.testing.assert_close(one, (values - 2.0) / math.sqrt(1e-8))
    none = torch.zeros(4, dtype=torch.bool)
    assert (masked_whiten(values, none, none) == 0).all()


# --- the variant ----------------------------------------------------------------------------------------------------


def test_variant_hand_computed_group_of_two():
    # group of 2, V(root) = mean(1, 0) = 0.5.
    # row 0: p = [0.5, 0.95, 0.6], cut at 2 with V = 0.25, R = 1 → raw [-0.25, -0.25, 0.75]; low tokens 0, 2
    # row 1: p = [0.3, 0.4], no cut, R = 0 → raw [-0.5, -0.5]; low tokens 0, 1
    # statistics over [-0.25, 0.75, -0.5, -0.5]: mean -0.125, unbiased var (0.015625 + 0.765625 + 2·0.140625) / 3
    probs = [[0.5, 0.95, 0.6, 0.01], [0.3, 0.4, 0.01, 0.01]]  # padding probabilities are low: never read
    mask = [[1, 1, 1, 0], [1, 1, 0, 0]]
    values = [[NAN, NAN, 0.25, 9.0], [NAN, NAN, NAN, NAN]]
    out = run(probs, mask, values, [1.0, 0.0], group_size=2)
    s = math.sqrt(1.0625 / 3 + 1e-8)
    expected = torch.tensor([[-0.125 / s, 0.0, 0.875 / s, 0.0], [-0.375 / s, -0.375 / s, 0.0, 0.0]])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert out.dtype == torch.float32


def test_nan_reward_rows_get_zero_and_stay_out_of_the_statistics():
    # group 0 = rows 0-1 as above but row 1 unscored: V(root) = 1 (row 0 alone);
    # row 0 raw: [0.25 - 1, ., 1 - 0.25] = [-0.75, ., 0.75] on its low tokens → mean 0, var 1.125 → ±0.75/√1.125
    probs = [[0.5, 0.95, 0.6], [0.3, 0.4, 0.2]]
    mask = [[1, 1, 1], [1, 1, 1]]
    values = [[NAN, NAN, 0.25], [NAN, 0.3, NAN]]
    out = run(probs, mask, values, [1.0, NAN], group_size=2)
    s = math.sqrt(1.125 + 1e-8)
    torch.testing.assert_close(out[0], torch.tensor([-0.75 / s, 0.0, 0.75 / s]), atol=1e-6, rtol=1e-6)
    assert (out[1] == 0).all()
    all_nan = run(probs, mask, values, [NAN, NAN], group_size=2)
    assert torch.equal(all_nan, torch.zeros(2, 3))


def test_all_equal_group_without_cuts_gets_zero_and_inf_raises():
    probs = [[0.5, 0.6], [0.3, 0.4]]
    out = run(probs, [[1, 1], [1, 1]], [[NAN, NAN], [NAN, NAN]], [1.0, 1.0], group_size=2)
    assert torch.equal(out, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="±inf"):
        run(probs, [[1, 1], [1, 1]], [[NAN, NAN], [NAN, NAN]], [math.inf, 1.0], group_size=2)


def test_confident_tokens_never_train_and_unscored_cut_merges_segments():
    # all tokens confident: nothing trains
    out = run([[0.95, 0.99], [0.97, 0.91]], [[1, 1], [1, 1]], [[NAN, NAN], [NAN, NAN]], [1.0, 0.0], group_size=2)
    assert torch.equal(out, torch.zeros(2, 2))
    # a NaN value (all K continuations unscored) is no cut: row 0's tokens 0-1 share V(0.4) − V(root) = 0.4 − 0.5
    probs, mask = [[0.5, 0.6, 0.7], [0.4, 0.3, 0.2]], [[1, 1, 1], [1, 1, 1]]
    unscored_cut = segment_advantages(torch.tensor([[NAN, NAN, 0.4], [NAN, NAN, NAN]]), torch.tensor(mask),
                                      torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(unscored_cut[0], torch.tensor([-0.1, -0.1, 0.6], dtype=torch.float64))
    without = run(probs, mask, [[NAN, NAN, 0.4], [NAN, NAN, NAN]], [1.0, 0.0], group_size=2)
    moved = run(probs, mask, [[NAN, 0.9, 0.4], [NAN, NAN, NAN]], [1.0, 0.0], group_size=2)
    assert not torch.allclose(moved, without)  # a finite value is a cut


def test_padding_garbage_changes_nothing():
    probs = [[0.5, 0.95, 0.6, 0.3], [0.3, 0.4, 0.2, 0.5]]
    clean = run(probs, [[1, 1, 1, 0], [1, 1, 0, 0]], [[NAN, NAN, 0.25, NAN], [NAN, NAN, NAN, NAN]], [1.0, 0.0], 2)
    ctx = TokenContext(completion_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32), group_size=2,
                       logps=torch.tensor([[math.log(0.5), math.log(0.95), math.log(0.6), NAN],
                                           [math.log(0.3), math.log(0.4), 1e9, -1e9]]),
                       rewards=torch.tensor([1.0, 0.0]),
                       segment_mc_values=torch.tensor([[NAN, NAN, 0.25, 1e9], [NAN, NAN, -1e9, 5.0]]))
    dirty = spo_segment_token_advantages(torch.zeros(2), ctx, spo_segment_prob_threshold=0.9)
    torch.testing.assert_close(dirty, clean)
    assert (dirty[clean == 0] == 0).all() and torch.isfinite(dirty).all()


def test_group_size_one_and_evaluation_batches():
    # G = 1: V(root) = own reward; no value (evaluation, nothing rolled out) → one segment R − V(root) = 0
    out = run([[0.5, 0.6]], [[1, 1]], [[NAN, NAN]], [1.0], group_size=1)
    assert torch.equal(out, torch.zeros(1, 2))
    ctx = TokenContext(completion_mask=torch.ones(2, 2), group_size=2, logps=torch.full((2, 2), math.log(0.5)),
                       rewards=torch.tensor([1.0, 0.0]))  # segment_mc_values None
    out = spo_segment_token_advantages(torch.zeros(2), ctx, spo_segment_prob_threshold=0.9)
    # raw ±0.5 on every token → mean 0, unbiased var 4·0.25/3 → ±0.5/√(1/3)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]) * 0.5 / math.sqrt(1 / 3 + 1e-8))


# --- config -------------------------------------------------------------------------------------------------------


def cfg(tmp_path, **kw):
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", token_weighting="spo_segment", **kw)


def test_defaults_are_the_official_ones(tmp_path):
    config = cfg(tmp_path)
    assert (config.spo_segment_num_rollouts, config.spo_segment_prob_threshold, config.spo_segment_cut_interval,
            config.spo_segment_max_cut_points) == (9, 0.9, 5, None)
    variant = get_variant("spo_segment")
    assert variant.flags["spo_segment_num_rollouts"] == 9 and "segment_mc_values" in variant.requires
    assert "K=9" in variant.needs[0]


@pytest.mark.parametrize("field,value", [
    ("spo_segment_num_rollouts", 0), ("spo_segment_num_rollouts", 2.5), ("spo_segment_prob_threshold", 0.0),
    ("spo_segment_prob_threshold", 1.5), ("spo_segment_cut_interval", 0), ("spo_segment_max_cut_points", 0),
    ("spo_segment_max_cut_points", True),
])
def test_bad_values_name_the_flag(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        cfg(tmp_path, **{field: value})


def test_vllm_params_without_variant_and_advantage_estimator_are_refused(tmp_path):
    with pytest.raises(ValueError, match="use_vllm"):
        cfg(tmp_path, use_vllm=True)
    with pytest.raises(ValueError, match="spo_segment_num_rollouts"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", spo_segment_num_rollouts=3)
    with pytest.raises(ValueError, match="advantage"):
        cfg(tmp_path, advantage_estimator="rloo")


def test_cli_list_shows_it(capsys):
    from trl_groupx.cli import main

    try:
        main(["list"])
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    assert "spo_segment" in capsys.readouterr().out
