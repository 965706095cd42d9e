"""SPO prioritised sampling: weights √(p̂(1−p̂)) + 0.05 from the spo_single tracker, the weighted draw without
replacement, the selection on a hand-made tracker, the keep-all filter, the config check."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.prompt_sampler import selection_for
from trl_groupx.sampling.spo_prioritized import (
    EXPLORATION_EPSILON,
    spo_prioritized,
    spo_prioritized_select,
    spo_priority_draw,
    spo_priority_weights,
)


def _tracker(pairs):
    """spo_single state from `{key: (α, β)}` (keys sorted ascending, as the tracker keeps them)."""
    keys = sorted(pairs)
    return {"keys": torch.tensor(keys, dtype=torch.int64),
            "values": torch.tensor([pairs[k] for k in keys], dtype=torch.float64)}


def _replay(weights, k, seed, draw):
    w = np.asarray(weights, dtype=np.float64)
    return np.random.default_rng([seed, draw]).choice(w.size, size=k, replace=False, p=w / w.sum()).tolist()


# ---- weights -------------------------------------------------------------------------------------------------------


def test_weights_uncertain_certain_unseen():
    # key 7: α = β = 3 → p̂ = .5 → √.25 + .05 = .55
    # key 3: α = 99, β = 1e-9 → p̂ ≈ 1, p̂(1−p̂) ≈ 1e-9/99 → .05 + 3.18e-6
    # key 5: not in the tracker → p̂ = .5 (official offline_N = 0 prior) → .55
    w = spo_priority_weights(_tracker({7: (3.0, 3.0), 3: (99.0, 1e-9)}), torch.tensor([7, 3, 5]))
    assert w[0].item() == pytest.approx(0.55) and w[2].item() == pytest.approx(0.55)
    assert w[1].item() == pytest.approx(EXPLORATION_EPSILON + math.sqrt(1e-9 / 99), rel=1e-9)  # 1 − p̂ loses digits
    # p̂ = 1/5: √(.2 · .8) + .05 = .4 + .05 = .45
    assert spo_priority_weights(_tracker({1: (1.0, 4.0)}), torch.tensor([1])).item() == pytest.approx(0.45)


def test_weights_empty_tracker_and_p_hat_outside_unit_interval():
    assert spo_priority_weights({}, torch.tensor([1, 2])).tolist() == pytest.approx([0.55, 0.55])
    # rewards > 1 can push the running mean above 1: clipped to 1 → weight .05 (no NaN from a negative root)
    assert spo_priority_weights(_tracker({4: (3.0, -1.0)}), torch.tensor([4])).item() == pytest.approx(0.05)


# ---- draw ----------------------------------------------------------------------------------------------------------


def test_draw_is_numpys_weighted_choice_without_replacement_and_deterministic():
    w = torch.tensor([0.55, 0.05, 0.55, 0.45], dtype=torch.float64)
    got = spo_priority_draw(w, 2, seed=42, draw=3)
    assert got == _replay(w.tolist(), 2, 42, 3) and got == spo_priority_draw(w, 2, seed=42, draw=3)
    assert len(set(got)) == 2
    assert len({tuple(spo_priority_draw(w, 2, 42, d)) for d in range(20)}) > 1  # the counter moves the draw


def test_draw_frequencies_follow_the_weights():
    # single draws: P = w / Σw = .55/1.15 ≈ .478, .05/1.15 ≈ .043, .478 (4000 draws: s.d. ≤ .008)
    w = torch.tensor([0.55, 0.05, 0.55], dtype=torch.float64)
    freq = np.bincount([spo_priority_draw(w, 1, 0, d)[0] for d in range(4000)], minlength=3) / 4000
    assert freq[1] == pytest.approx(0.05 / 1.15, abs=0.015) and freq[0] == pytest.approx(0.55 / 1.15, abs=0.04)


def test_draw_whole_dataset_and_too_many():
    w = torch.tensor([0.55, 0.05, 0.55], dtype=torch.float64)
    assert sorted(spo_priority_draw(w, 3, 1, 0)) == [0, 1, 2]
    with pytest.raises(ValueError, match="distinct prompts"):
        spo_priority_draw(w, 4, 1, 0)


# ---- selection on a hand-made tracker --------------------------------------------------------------------------------


def test_selection_reads_the_tracker_and_counts_draws():
    # dataset keys [10, 20, 30]: p̂ = .5 (α = β = 2), p̂ ≈ 1 (α = 50, β = 1e-12), unseen → weights .55, ≈.05, .55
    tracker = _tracker({10: (2.0, 2.0), 20: (50.0, 1e-12)})
    trainer = SimpleNamespace(variant_state={"spo_single": tracker})
    state = {"dataset_keys": torch.tensor([10, 20, 30])}
    assert selection_for("spo_prioritized") is spo_prioritized_select
    first = spo_prioritized_select(state, 2, 3, trainer, seed=5)
    weights = [0.55, 0.05 + math.sqrt(1e-12 / 50), 0.55]
    assert first == _replay(weights, 2, 5, 0) and state["draws"] == 1
    assert spo_prioritized_select(state, 2, 3, trainer, seed=5) == _replay(weights, 2, 5, 1) and state["draws"] == 2
    # same state and seed → same prompts (every process draws alike); another process's copy agrees
    copy = {"dataset_keys": torch.tensor([10, 20, 30]), "draws": 0}
    assert spo_prioritized_select(copy, 2, 3, trainer, seed=5) == first
    with pytest.raises(ValueError, match="must pass `trainer`"):
        spo_prioritized_select({}, 2, 3, seed=5)


# ---- filter and config -----------------------------------------------------------------------------------------------


def test_filter_keeps_every_rollout_and_clears_pending():
    state = {"pending": torch.tensor([1, 0]), "draws": 1}
    batch = RolloutBatch(rewards=torch.tensor([1.0, float("nan"), 0.0, 1.0]), completion_lengths=torch.ones(4),
                         group_size=2)
    assert spo_prioritized(batch, state=state).tolist() == [True] * 4
    assert state["pending"].numel() == 0 and state["draws"] == 1


def test_config_requires_the_spo_single_tracker():
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "spo_prioritized"}
    with pytest.raises(ValueError, match="rollout_filter='spo_prioritized'.*advantage_estimator='spo_single'"):
        trl_groupx.GRPOConfig(**base)
    assert trl_groupx.GRPOConfig(**base, advantage_estimator="spo_single").rollout_filter == "spo_prioritized"
