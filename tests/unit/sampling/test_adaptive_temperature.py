"""HAPO's Adaptive Temperature Sampling: the official sampler's temperature and `compute_entropy_h` statistics on
hand-computed logits and entropies, the logits processor, the EOS mask and the config-time checks."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.sampling.adaptive_temperature import (
    EntropyAdaptiveTemperature,
    EntropyStatistics,
    completion_token_mask,
    entropy_based_temperature,
    entropy_statistics,
    normalised_entropy,
    temperature_scale,
    token_entropy,
)
from trl_groupx.token_weights.hapo import entropy_h_hat

NEG_INF = float("-inf")
LN2, LN4 = math.log(2.0), math.log(4.0)
# one statistic set used throughout: pivot m = 0, spread s = 1, max h⁺ = 2, min h⁻ = −4
STATS = EntropyStatistics(median=0.0, std=1.0, pos_max=2.0, neg_min=-4.0)
UNIFORM4 = [0.0, 0.0, 0.0, 0.0]  # H = ln 4, ℓ = ln ln 4 = 0.326634 > 0
UNIFORM2 = [0.0, 0.0, NEG_INF, NEG_INF]  # H = ln 2, ℓ = ln ln 2 = −0.366513 < 0
ONE_HOT = [0.0, NEG_INF, NEG_INF, NEG_INF]  # H = 0 → ℓ = ln 1e-6 = −13.8155 (sampler's log floor)


def _h(entropy: float) -> float:
    return (math.log(max(entropy, 1e-6)) - STATS.median) / (STATS.std + 1e-6)  # the sampler adds 1e-6 to s


def test_entropy_of_uniform_two_point_and_one_hot_rows():
    logits = torch.tensor([UNIFORM4, UNIFORM2, ONE_HOT])
    torch.testing.assert_close(token_entropy(logits), torch.tensor([LN4, LN2, 0.0]))  # −inf entries: 0·log 0 = 0
    # 2 tokens at p = (1/4, 3/4): H = ¼ ln 4 + ¾ ln(4/3) = 0.562335
    torch.testing.assert_close(token_entropy(torch.tensor([[0.0, math.log(3.0)]])), torch.tensor([0.5623351]))


@pytest.mark.parametrize("official_sign", [True, False])
def test_temperature_on_hand_computed_rows(official_sign):
    tau, base = 0.05, 0.7
    logits = torch.tensor([UNIFORM4, UNIFORM2, ONE_HOT])
    # uniform-4: h = 0.326634 > 0 → ĥ = h / 2 = 0.163317 (either sign convention)
    hat4 = _h(LN4) / 2.0
    # uniform-2: h = −0.366513 ≤ 0 → official ĥ = h / neg_min = +0.091628; paper ĥ = h / |neg_min| = −0.091628
    hat2 = _h(LN2) / (-4.0 if official_sign else 4.0)
    # one-hot: h = −13.8155 → |ĥ| = 3.45 clamped to 1: official +1 (hotter), paper −1 (colder)
    hat1 = 1.0 if official_sign else -1.0
    expected = torch.tensor([1 + tau * hat4, 1 + tau * hat2, 1 + tau * hat1])
    torch.testing.assert_close(temperature_scale(logits, STATS, tau, official_sign), expected)
    torch.testing.assert_close(entropy_based_temperature(logits, base, STATS, tau, official_sign), base * expected)
    assert expected[1].item() == pytest.approx(1.0045814 if official_sign else 0.9954186, abs=1e-7)


def test_official_sign_never_lowers_the_temperature_and_tau_bounds_it():
    torch.manual_seed(0)
    logits = torch.randn(64, 11) * torch.logspace(-2, 2, 64)[:, None]  # from near-uniform to near-one-hot rows
    for tau in (0.0, 0.05, 0.5, 3.0):
        official = temperature_scale(logits, STATS, tau, True)
        assert (official >= 1.0).all() and (official <= 1.0 + tau + 1e-6).all()
        if tau < 1:
            paper = temperature_scale(logits, STATS, tau, False)
            assert (paper >= 1.0 - tau - 1e-6).all() and (paper <= 1.0 + tau + 1e-6).all()
            assert tau == 0 or ((paper < 1.0).any() and (paper > 1.0).any())  # both directions with the paper's
    assert torch.equal(temperature_scale(logits, STATS, 0.0, False), torch.ones(64))  # τ = 0: exactly T


def test_pivot_entropy_gives_the_base_temperature_and_extremes_clamp():
    at_pivot = EntropyStatistics(median=math.log(LN4), std=1.0, pos_max=2.0, neg_min=-4.0)
    logits = torch.tensor([UNIFORM4])
    assert normalised_entropy(token_entropy(logits), at_pivot, True).item() == 0.0  # h = 0 → ĥ = 0 → factor 1
    # a tiny pos_max (all-equal previous batch: scales floored at 1e-8): any entropy above the pivot clamps to 1
    floored = EntropyStatistics(median=0.0, std=1e-4, pos_max=1e-8, neg_min=-1e-8)
    assert temperature_scale(logits, floored, 0.05, True).item() == pytest.approx(1.05)
    assert temperature_scale(torch.tensor([UNIFORM2]), floored, 0.05, False).item() == pytest.approx(0.95)


def test_no_statistics_means_the_base_temperature():
    logits = torch.randn(3, 7)
    torch.testing.assert_close(entropy_based_temperature(logits, 0.9, None, 0.05), torch.full((3,), 0.9))


def test_statistics_by_hand():
    # ℓ = ln H = [−2, −1, 0, 1, 2] (shuffled); pivot 0.8 → index round(0.8·4) = 3 → m = 1; h = ℓ − m = [−3..1],
    # mean h² = 15/5 = 3 → s = √3; h/s ∈ [−√3, 1/√3]: pos_max = 1/√3, neg_min = −√3
    entropies = torch.tensor([0.0, 2.0, -2.0, 1.0, -1.0]).exp()
    stats = entropy_statistics(entropies, 0.8)
    assert stats.median == pytest.approx(1.0) and stats.std == pytest.approx(math.sqrt(3))
    assert stats.pos_max == pytest.approx(1 / math.sqrt(3)) and stats.neg_min == pytest.approx(-math.sqrt(3))
    # pivot 0.5 → m = 0, h = [−2..2], mean h² = 2 → s = √2, pos_max = √2, neg_min = −√2
    stats = entropy_statistics(entropies, 0.5)
    assert stats == pytest.approx(EntropyStatistics(0.0, math.sqrt(2), math.sqrt(2), -math.sqrt(2)))


def test_statistics_quantile_rounds_half_to_even_like_the_official():
    entropies = torch.tensor([-1.0, 0.0, 1.0]).exp()  # ℓ = [−1, 0, 1]
    assert entropy_statistics(entropies, 0.25).median == pytest.approx(-1.0)  # index round(0.5) = 0
    assert entropy_statistics(entropies, 0.75).median == pytest.approx(1.0)  # index round(1.5) = 2
    assert entropy_statistics(entropies, 0.0).median == pytest.approx(-1.0)
    assert entropy_statistics(entropies, 1.0).median == pytest.approx(1.0)


def test_statistics_edge_cases():
    assert entropy_statistics(torch.zeros(0), 0.8) is None  # a batch without tokens: keep the previous ones
    equal = entropy_statistics(torch.full((6,), 0.3), 0.8)  # all equal: h = 0, variance floored, scales floored
    assert equal.std == pytest.approx(1e-4) and equal.pos_max == 1e-8 and equal.neg_min == -1e-8
    zero = entropy_statistics(torch.tensor([0.0, 1.0]), 0.0)  # H = 0 → ln 1e-8 (the statistics' log floor)
    assert zero.median == pytest.approx(math.log(1e-8))


def test_normalisation_matches_the_token_stage_h_hat():
    """On the batch that produced the statistics, the sampler's ĥ is HAPO's `compute_entropy_h` ĥ (the token stage's
    `entropy_h_hat`, paper sign; its absolute value for the official sign), up to the sampler's 1e-6 epsilons."""
    torch.manual_seed(1)
    entropies = torch.rand(40) * 3 + 0.05
    stats = entropy_statistics(entropies, 0.8)
    mask = torch.ones(1, 40, dtype=torch.bool)
    paper = entropy_h_hat(entropies[None], mask, 0.8)[0]
    torch.testing.assert_close(normalised_entropy(entropies, stats, False), paper, atol=1e-5, rtol=0)
    torch.testing.assert_close(normalised_entropy(entropies, stats, True), paper.abs(), atol=1e-5, rtol=0)


def test_processor_rescales_each_row_and_records_entropies():
    scores = torch.tensor([UNIFORM4, UNIFORM2, ONE_HOT, [2.0, 1.0, 0.0, -1.0]])
    processor = EntropyAdaptiveTemperature(STATS, 0.05, True, record_temperature=1.0)
    out = processor(torch.zeros(4, 3, dtype=torch.long), scores.clone())
    assert out.shape == scores.shape
    scale = temperature_scale(scores, STATS, 0.05, True)
    assert len(set(scale.tolist())) == 4  # four different entropies, four different temperatures
    torch.testing.assert_close(out, scores / scale[:, None])
    assert torch.isneginf(out[1:3, 2:]).all() and torch.isfinite(out[0]).all()
    torch.testing.assert_close(processor.entropies[0], token_entropy(scores))
    torch.testing.assert_close(processor.scales[0], scale)
    again = EntropyAdaptiveTemperature(STATS, 0.05, True, 1.0)(torch.zeros(4, 3, dtype=torch.long), scores.clone())
    assert torch.equal(out, again)  # deterministic


def test_processor_without_statistics_only_records():
    scores = torch.tensor([[0.0, 0.5 * math.log(3.0)]])
    processor = EntropyAdaptiveTemperature(None, 0.05, True, record_temperature=0.5)
    out = processor(torch.zeros(1, 2, dtype=torch.long), scores)
    assert out is scores and processor.scales == []
    # recorded at T = 0.5: logits/T = [0, ln 3] → p = (1/4, 3/4) → H = 0.562335 (what the loss-side forward sees)
    torch.testing.assert_close(processor.entropies[0], torch.tensor([0.5623351]))


def test_completion_token_mask_keeps_up_to_the_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [5, 5, 5, 5], [2, 0, 0, 0], [9, 3, 0, 3]])
    mask = completion_token_mask(ids, [2, 3])
    assert mask.int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]


def _config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **flags)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"hapo_temperature_tau": -0.1}, "hapo_temperature_tau must be a finite number >= 0"),
        ({"hapo_temperature_tau": float("nan")}, "hapo_temperature_tau must be a finite number >= 0"),
        ({"hapo_temperature_tau": float("inf")}, "hapo_temperature_tau must be a finite number >= 0"),
        ({"hapo_temperature_tau": 1.0, "hapo_temperature_official_sign": False}, "use tau < 1"),
        ({"hapo_temperature_entropy_pivot": 1.5}, "hapo_temperature_entropy_pivot must lie in"),
        ({"use_vllm": True}, "official code patches vLLM's own sampler"),
        ({"use_transformers_continuous_batching": True}, "use_transformers_continuous_batching=False"),
    ],
)
def test_bad_values_fail_at_config_time(flags, match):
    with pytest.raises(ValueError, match=match):
        _config(hapo_adaptive_temperature=True, **flags)


def test_its_fields_need_the_flag():
    with pytest.raises(ValueError, match="hapo_temperature_tau=0.1 only applies with hapo_adaptive_temperature=True"):
        _config(hapo_temperature_tau=0.1)
    with pytest.raises(ValueError, match="hapo_temperature_official_sign"):
        _config(hapo_temperature_official_sign=True)


def test_valid_settings_construct():
    _config(hapo_adaptive_temperature=True, hapo_temperature_tau=3.0,
            hapo_temperature_official_sign=True)  # official sign: T(1 + τ ĥ) ≥ T for any τ
    _config(hapo_adaptive_temperature=True, hapo_temperature_tau=0.0)
    _config(hapo_adaptive_temperature=True, hapo_temperature_tau=0.5, hapo_temperature_official_sign=False)
