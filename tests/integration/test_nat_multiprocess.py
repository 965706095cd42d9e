"""NAT under two processes (torchrun, gloo, CPU): both ranks draw the same token selection from (seed, global step),
and each keeps its slice of the global Horvitz–Thompson token advantages."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("nat_mp_worker.py")


@needs_torchrun
def test_nat_two_processes_agree(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["n_global"] == 8, r  # 2 processes × 4 rollouts were gathered
        assert r["matches_formula"], r
        assert r["ranks_agree"], r
        assert r["some_dropped"], r
