"""S2L-PO on two processes: both ranks take the same explorer/learner decision from global_step, each generating its
own rows with the explorer on explorer batches and with the policy on learner batches (s2l_po_mp_worker.py)."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("s2l_po_mp_worker.py")


@needs_torchrun
def test_s2l_po_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["explorer_rows"] and r["explorer_advantages"] and r["not_policy_rows"], r
        assert r["learner_rows"], r
        assert r["flags"] == {"1": 1.0, "2": 1.0, "3": 0.0}, r  # N = 3: explorer, explorer, learner
