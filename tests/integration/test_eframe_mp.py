"""EFRame with two processes (torchrun, gloo, CPU): equal extra generate calls on both ranks, the kept extra row and
the replay dealt out evenly, one buffer identical on both ranks, training that keeps the ranks in sync."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("eframe_mp_worker.py")


@needs_torchrun
def test_two_processes_explore_and_replay_in_lockstep(tmp_path):
    launch(WORKER, tmp_path, timeout=400)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        # per batch: the on-policy call (2 prompts a rank) at T = 1, the extra call (5 a rank) at T = 1.2
        assert r["calls"] == [[2, 1.0], [5, 1.2]] * 4, r
        # 2 on-policy rows (masked: A = 0) + 1 appended row a rank; batch 4: + the 4 replayed rows (3 a rank)
        assert [b["rows"] for b in r["batches"]] == [3, 3, 3, 5], r
        assert all(b["num_items_ok"] for b in r["batches"]), r
        assert r["buffer_rows"] == 4 and r["replayed"] == [0.0, 0.0, 0.0, 4.0], r
        assert r["states_agree"] and r["params_agree"] and r["finite"], r
    # the kept extra row is trained on one rank, the null row on the other; replayed rows all trained
    assert sorted(b["trained_rows"] for r in results for b in r["batches"][:3]) == [0, 0, 0, 1, 1, 1]
    assert sum(r["batches"][3]["trained_rows"] for r in results) == 5
