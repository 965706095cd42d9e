"""Pilot-Commit's pure parts: pilot accuracy, the band and exclusion rule, the buffer (add, off-steps flush, take by
rule), the candidate stream, the rounds of one generation batch on hand-built pilot rewards, and which pilot
rollouts a committed group trains (the response rule, the kept rollouts of the buffered prompts)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trl_groupx.sampling.pilot_commit import (
    buffer_add,
    buffer_flush,
    buffer_take,
    classify,
    commit_rounds,
    draw_candidates,
    empty_buffer,
    init_state,
    max_variance_subset,
    pilot_accuracy,
    pilot_sample_count,
    reused_pilot_count,
)
from trl_groupx.sampling.pilot_commit_glue import PilotRecorder

NAN = math.nan


def test_pilot_accuracy_counts_scored_successes():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0],  # 3/4
                            [0.0, NAN, 1.0, NAN],  # 1/2: NaN is not a trial
                            [NAN, NAN, NAN, NAN],  # no estimate
                            [0.5, 2.0, 0.9, 1.0]])  # threshold 1: 2/4
    p_hat, std = pilot_accuracy(rewards, 1.0)
    torch.testing.assert_close(p_hat[[0, 1, 3]], torch.tensor([0.75, 0.5, 0.5], dtype=torch.float64))
    assert math.isnan(p_hat[2]) and math.isnan(std[2])
    # population std of the 0/1 accuracies (np.std): sqrt(.75·.25) = .4330, sqrt(.25) = .5
    torch.testing.assert_close(std[[0, 1]], torch.tensor([math.sqrt(0.1875), 0.5], dtype=torch.float64))
    assert float(std[0]) == pytest.approx(np.std([1, 0, 1, 1]))


def test_pilot_accuracy_group_sizes_one_and_two_and_inf():
    p_hat, std = pilot_accuracy(torch.tensor([[1.0], [0.0]]), 1.0)
    assert p_hat.tolist() == [1.0, 0.0] and std.tolist() == [0.0, 0.0]
    p_hat, _ = pilot_accuracy(torch.tensor([[1.0, 0.0]]), 1.0)
    assert p_hat.tolist() == [0.5]
    with pytest.raises(ValueError, match="infinite pilot reward"):
        pilot_accuracy(torch.tensor([[1.0, math.inf]]), 1.0)


def test_band_and_exclusion():
    p_hat = torch.tensor([0.0, 0.125, 0.5, 0.75, 0.875, 1.0, NAN], dtype=torch.float64)
    kept, excluded = classify(p_hat, 0.125, 0.75, 1.0)
    assert kept.tolist() == [False, True, True, True, False, False, False]  # bounds inclusive (official filter_batch)
    assert excluded.tolist() == [False, False, False, False, False, True, False]  # NaN: neither
    _, none = classify(p_hat, 0.125, 0.75, None)
    assert not none.any()


def test_buffer_add_replaces_and_flush_evicts_after_off_steps():
    state = empty_buffer()
    buffer_add(state, [3, 5], [0.5, 0.4], step=1, round_=0)
    buffer_add(state, [5, 7], [0.3, 0.2], step=3, round_=4)  # 5 re-piloted: its entry is replaced
    assert state["buffer_index"].tolist() == [3, 5, 7] and state["buffer_step"].tolist() == [1, 3, 3]
    assert state["buffer_round"].tolist() == [0, 4, 4] and state["buffer_std"].tolist() == [0.5, 0.3, 0.2]
    assert buffer_flush(state, current_step=5, off_steps=4) == 0  # 5 − 1 = 4 ≤ 4: kept
    assert buffer_flush(state, current_step=6, off_steps=4) == 1  # 6 − 1 = 5 > 4: 3 evicted
    assert state["buffer_index"].tolist() == [5, 7]
    assert buffer_flush(state, current_step=4, off_steps=0) == 2 and state["buffer_index"].numel() == 0


def test_buffer_take_rules():
    def filled():
        state = empty_buffer()
        buffer_add(state, [10, 11, 12, 13], [0.3, 0.5, 0.5, 0.4], step=1, round_=1)
        buffer_add(state, [14], [0.5], step=2, round_=2)
        return state

    rng = np.random.default_rng(0)
    state = filled()
    # max_variance: std .5 first, newer step first (14), then 11 before 12 (earlier entry)
    assert buffer_take(state, 3, "max_variance", rng) == [(14, 2), (11, 1), (12, 1)]  # in rank order
    assert state["buffer_index"].tolist() == [10, 13]
    state = filled()
    assert [i for i, _ in buffer_take(state, 2, "most_recent", rng)] == [14, 10]  # step 2, then earliest of step 1
    state = filled()
    taken = buffer_take(state, 2, "random", np.random.default_rng(1))
    assert len(taken) == 2 and state["buffer_index"].numel() == 3
    assert taken == buffer_take(filled(), 2, "random", np.random.default_rng(1))  # seeded
    state = filled()
    assert len(buffer_take(state, 9, "random", rng)) == 5 and state["buffer_index"].numel() == 0  # all when ≤ size
    assert buffer_take(state, 2, "random", rng) == []


def test_candidate_stream_skips_excluded_and_empties_the_buffer_at_the_end_of_a_pass():
    state = {}
    init_state(state)
    first = draw_candidates(state, 3, 4, seed=0)
    order = np.random.default_rng([0, 0]).permutation(4).tolist()
    assert first == order[:3]
    state["excluded"] = torch.tensor([order[3]])
    buffer_add(state, [order[0]], [0.5], step=1)
    second = draw_candidates(state, 2, 4, seed=0)  # pass 0's last prompt is excluded; pass 1 starts
    next_order = [i for i in np.random.default_rng([0, 1]).permutation(4).tolist() if i != order[3]]
    assert second == next_order[:2] and state["pass"] == 1
    assert state["buffer_index"].numel() == 0  # end-of-epoch flush
    state["excluded"] = torch.arange(4)
    with pytest.raises(RuntimeError, match="every prompt of the dataset is excluded"):
        draw_candidates(state, 1, 4, seed=0)


def _scripted(accuracy: dict[int, list[float]]):
    calls = []

    def pilot(indices):
        calls.append(list(indices))
        return torch.tensor([accuracy[i] for i in indices])

    return pilot, calls


def test_rounds_commit_band_prompts_one_round_after_their_pilot():
    # dataset of 6: p̂ = 1 (0), 0 (1), .5 (2), .25 (3), NaN (4), .75 (5); two prompts per batch, two candidates a round
    acc = {0: [1, 1, 1, 1], 1: [0, 0, 0, 0], 2: [1, 0, 1, 0], 3: [1, 0, 0, 0], 4: [NAN] * 4, 5: [1, 1, 1, 0]}
    pilot, calls = _scripted(acc)
    state = {}
    init_state(state)
    state["dataset_size"], state["success_threshold"] = 6, 1.0
    kwargs = dict(num_prompts=2, pilot_prompts=2, low=0.125, high=0.75, exclude=1.0, off_steps=4, rule="max_variance",
                  max_rounds=10, seed=0)
    order = np.random.default_rng([0, 0]).permutation(6).tolist()
    committed, stats = commit_rounds(state, pilot, **kwargs)
    band = [i for i in order if i in (2, 3, 5)]
    # round r pilots order[2r : 2r + 2]; band prompts enter the buffer at their round and leave at a later one
    assert calls == [order[2 * r: 2 * r + 2] for r in range(len(calls))]
    assert set(committed) <= {2, 3, 5} and len(committed) == 2
    assert (state["committed_rounds"][:, 0] < state["committed_rounds"][:, 1]).all()
    assert set(state["excluded"].tolist()) == ({0} & {i for c in calls for i in c})
    assert 4 not in state["buffer_index"].tolist() and 1 not in state["buffer_index"].tolist()
    assert stats["rounds"] == len(calls) and stats["kept"] == len([i for c in calls for i in c if i in band])
    assert state["step"] == 1


def test_buffered_prompts_are_committed_first_and_stale_ones_evicted():
    acc = {i: [1, 0] for i in range(8)}  # every prompt in the band
    pilot, calls = _scripted(acc)
    state = {}
    init_state(state)
    state["dataset_size"], state["success_threshold"] = 8, 1.0
    buffer_add(state, [6, 7], [0.5, 0.5], step=0, round_=0)  # left by earlier batches
    buffer_add(state, [5], [0.5], step=-5, round_=0)  # piloted 5 batches before the last one: evicted (off_steps 4)
    committed, stats = commit_rounds(state, pilot, num_prompts=2, pilot_prompts=2, low=0.125, high=0.75,
                                     exclude=1.0, off_steps=4, rule="most_recent", max_rounds=10, seed=0)
    assert sorted(committed) == [6, 7] and calls == [] and stats["rounds"] == 0  # full from the buffer: no pilot
    assert 5 not in state["buffer_index"].tolist()


def test_rounds_fill_nearest_the_band_after_max_rounds_or_raise():
    # p̂ (distance to [.125, .75]): prompt 0 → 0 (.125), 1 → .5 (in the band), 2 → 1 (.25), 3 → NaN (inf)
    acc = {0: [0.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 1.0], 3: [NAN, NAN]}
    pilot, calls = _scripted(acc)
    state = {}
    init_state(state)
    state["dataset_size"], state["success_threshold"] = 4, 1.0
    committed, stats = commit_rounds(state, pilot, num_prompts=3, pilot_prompts=2, low=0.125, high=0.75,
                                     exclude=None, off_steps=4, rule="random", max_rounds=2, seed=0)
    # two rounds pilot all four; 1 is buffered in its round and committed from the buffer; the two slots left take
    # 0 (.125) then 2 (.25); 3 (no estimate) is last
    assert sorted(i for c in calls for i in c) == [0, 1, 2, 3] and stats["filled"] == 2
    assert committed[-2:] == [0, 2] and 1 in committed and 3 not in committed
    assert (state["committed_rounds"][:, 0] < state["committed_rounds"][:, 1]).all()
    state = {}
    init_state(state)
    state["dataset_size"], state["success_threshold"] = 4, 1.0
    with pytest.raises(RuntimeError, match="pilot_commit_max_rounds=1"):
        commit_rounds(state, pilot, num_prompts=3, pilot_prompts=1, low=0.125, high=0.75, exclude=1.0, off_steps=4,
                      rule="random", max_rounds=1, seed=0)


def test_default_counts_split_the_group_as_the_official_scripts():
    # p32c96 and p16c48: a quarter of the group pilots, at least 2 (one pilot is never in the band); every pilot
    # rollout is reused (n_effective: null)
    assert [pilot_sample_count(None, g) for g in (128, 64, 16, 12, 8, 4, 3, 2)] == [32, 16, 4, 3, 2, 2, 2, 2]
    assert pilot_sample_count(6, 16) == 6
    assert reused_pilot_count(None, 4) == 4 and reused_pilot_count(0, 4) == 0 and reused_pilot_count(2, 4) == 2


def test_max_variance_subset_balances_successes_and_failures():
    successes = [True, False, True, True, False, False, True, False]
    pick = max_variance_subset(successes, 4, np.random.default_rng(0))
    assert len(set(pick)) == 4 and [successes[i] for i in pick] == [True, True, False, False]  # 2 + 2, ones first
    pick = max_variance_subset(successes, 3, np.random.default_rng(0))
    assert [successes[i] for i in pick] == [True, False, False]  # size // 2 = 1 success, 2 failures
    # one success only: it and failures for the rest; no failure: successes only
    one = [False, False, True, False]
    assert sorted(one[i] for i in max_variance_subset(one, 3, np.random.default_rng(1))) == [False, False, True]
    assert max_variance_subset([True, True, True], 2, np.random.default_rng(0)) in ([0, 1], [1, 0], [0, 2], [2, 0],
                                                                                      [1, 2], [2, 1])
    assert [one[i] for i in max_variance_subset(one, 1, np.random.default_rng(0))] == [False]  # 1 // 2 = 0 successes
    assert max_variance_subset([True], 1, np.random.default_rng(0)) == [0]  # group of one
    assert max_variance_subset(successes, 8, np.random.default_rng(0)) == list(range(8))  # all: kept in order
    assert max_variance_subset(successes, 0, np.random.default_rng(0)) == []


def _entry(round_, index, scores):
    """A pilot record: completions [index, k], per-function rewards (n, 1) = scores (one reward function, weight 1)."""
    return {"round": round_, "ids": [torch.tensor([index, k]) for k in range(len(scores))],
            "rewards": torch.tensor(scores).view(-1, 1)}


def _recorder(reused, buffered, committed_rounds, stored=None, latest=None):
    state = {"success_threshold": 1.0, "step": 3, "buffer_index": torch.tensor([i for i, _ in buffered]),
             "buffer_round": torch.tensor([r for _, r in buffered]),
             "committed_rounds": torch.tensor(committed_rounds).view(-1, 2)}
    if stored is not None:
        state["pilot_rollouts"] = stored
    recorder = PilotRecorder(SimpleNamespace(reward_weights=torch.ones(1)), state, samples=4, reused=reused)
    recorder.latest = latest or {}
    return recorder, state


def test_committed_groups_get_their_own_pilots_and_the_store_mirrors_the_buffer():
    # prompt 5 was buffered by an earlier batch (stored), prompt 7 piloted this batch in round 9 and committed by a
    # fill, prompt 8 piloted in round 9 and still buffered; prompt 6's stored entry has left the buffer
    stored = {5: _entry(4, 5, [1.0, 0.0, 1.0, 0.0]), 6: _entry(3, 6, [0.0] * 4)}
    latest = {(9, 7): _entry(9, 7, [1.0, 1.0, 0.0, 0.0]), (9, 8): _entry(9, 8, [0.0, 1.0, 0.0, 0.0])}
    recorder, state = _recorder(4, [(8, 9)], [[4, 10], [9, 10]], stored, latest)
    recorder.keep_for_training([5, 7], seed=0)
    chosen = state["commit_pilots"]
    assert [c["round"] for c in chosen] == [4, 9]
    assert [[t.tolist() for t in c["ids"]] for c in chosen] == [[[5, k] for k in range(4)], [[7, k] for k in range(4)]]
    assert torch.equal(chosen[1]["rewards"].flatten(), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert list(state["pilot_rollouts"]) == [8] and state["pilot_rollouts"][8] is latest[(9, 8)]


def test_fewer_reused_pilots_take_the_max_variance_pick_and_none_keeps_no_store():
    latest = {(2, 3): _entry(2, 3, [1.0, 1.0, 1.0, 0.0])}
    recorder, state = _recorder(2, [], [[2, 3]], latest=latest)
    recorder.keep_for_training([3], seed=0)
    assert sorted(state["commit_pilots"][0]["rewards"].flatten().tolist()) == [0.0, 1.0]  # one success, one failure
    assert state["pilot_rollouts"] == {}
    recorder, state = _recorder(0, [(3, 2)], [[2, 3]], stored={3: _entry(2, 3, [1.0] * 4)}, latest=latest)
    recorder.keep_for_training([3], seed=0)
    assert "commit_pilots" not in state and "pilot_rollouts" not in state  # pilots only select: nothing kept


def test_a_committed_prompt_without_its_pilots_is_a_clear_error():
    recorder, state = _recorder(4, [], [[1, 2]], stored={3: _entry(0, 3, [1.0] * 4)})  # round 1 expected, 0 stored
    with pytest.raises(RuntimeError, match="pilot rollouts of prompt 3 \\(pilot round 1\\) were not kept"):
        recorder.keep_for_training([3], seed=0)
