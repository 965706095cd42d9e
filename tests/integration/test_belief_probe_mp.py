"""belief_probe on two processes: segments and answer log-probs are probed per rank and gathered, so every rank
computes the same global token advantages and keeps its own slice; every rank runs as many probe forwards as the
busiest one (sharded models need equal forward counts)."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("belief_probe_mp_worker.py")


@needs_torchrun
def test_belief_probe_two_processes_agree(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["n_global"] == 8, r  # 2 processes × 4 rollouts were gathered
        assert r["matches_formula"], r
        assert r["own_row_beliefs"], r
        assert r["ranks_agree"], r
        # rank 1 kept one probe, rank 0 more than 4: both ran ⌈rank 0's probes / 4⌉ forwards (chunks of 4)
        assert r["probes"][1] == 1 and r["probes"][0] > 4, r
        assert r["forwards"] == [-(-r["probes"][0] // 4)] * 2, r
