"""RePO with two processes (torchrun, gloo, CPU): a group split over both ranks, one global buffer identical on each,
the replayed rows dealt out evenly (a null row filling the odd count), the loss-token count over both ranks, and
training that keeps the ranks in sync."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("repo_mp_worker.py")


@needs_torchrun
def test_two_processes_share_one_buffer(tmp_path):
    launch(WORKER, tmp_path, timeout=300)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for r in results:
        # batch 1: 2 on-policy rows a rank, nothing buffered yet; batches 2 and 3: k = 3 replayed + 1 null row, 2 a rank
        assert [b["rows"] for b in r["batches"]] == [2, 4, 4], r
        assert [b["replayed"] for b in r["batches"]] == [0, 2, 2], r
        assert all(b["num_items_ok"] for b in r["batches"]), r
        assert r["replayed_count"] == [0, 3, 3] and r["replayed_from_first"], r
        assert r["buffer_sizes"] == [8], r  # three visits of 4, at most 8 kept
        assert r["states_agree"] and r["params_agree"] and r["finite"], r
    assert sum(b["null_rows"] for r in results for b in r["batches"]) == 2  # one per replaying batch
