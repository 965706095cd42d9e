"""GCPO reference injection with two processes (torchrun, gloo, CPU): a group spanning both processes, injected rows
owned by one rank only, the same global rewards on every rank, and a training step that keeps the ranks in sync."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("gcpo_ref_mp_worker.py")


@needs_torchrun
def test_two_processes_inject_in_lockstep(tmp_path):
    launch(WORKER, tmp_path, timeout=300)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        # both ranks re-score 2 rows (rank 1: its 2 references; rank 0: 2 filler rows), so the gather matches
        assert r["rescore_sizes"] == [2], r
        assert r["global_rewards"] == [1.0, 0, 0, 0, 0, 0, 0, 1.0, 0, 0, 0, 1.0], r
        assert r["injected_groups"] == [2.0] and r["refs_ok"], r
        assert r["advantages_match"] and r["num_items_ok"] and r["params_agree"], r
