"""spo_segment on two processes: each rank continues its own cut prefixes, all ranks make the same generate calls
(count, size, max_new_tokens) however unequal their cuts, and every rank holds the same global values and token
advantages, keeping its own slice."""

import json
from pathlib import Path

from tests.integration.test_spo_segment import K
from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("spo_segment_mp_worker.py")


@needs_torchrun
def test_spo_segment_two_processes_agree(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["n_global"] == 8, r  # 2 processes × 4 rollouts were gathered
        assert r["off_cut_nan"] and r["matches_formula"] and r["ranks_agree"], r
        # rank 1 kept one cut (K continuations), rank 0 several distinct prefixes: both ran ⌈rank 0's K·prefixes / 4⌉
        # calls of 4 (the rows of a process), longest budget first
        assert r["cuts"][1] == 1 and r["requests"][1] == 1 and r["requests"][0] * K > 4, r
        assert r["requests"][0] <= r["cuts"][0], r
        assert len(r["calls"]) == -(-r["requests"][0] * K // 4), r
        assert all(size == 4 for size, _ in r["calls"]), r
        budgets = [b for _, b in r["calls"]]
        assert budgets == sorted(budgets, reverse=True) and max(budgets) <= 5, r
