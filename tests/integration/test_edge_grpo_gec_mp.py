"""EDGE-GRPO GEC with two processes (torchrun, gloo, CPU): a group spanning both processes, corrected rows on both
ranks, one re-scoring call of equal size, the same global rewards on every rank, and a training step with EDA that
keeps the ranks in sync."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("edge_grpo_gec_mp_worker.py")


@needs_torchrun
def test_two_processes_correct_in_lockstep(tmp_path):
    launch(WORKER, tmp_path, timeout=300)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["generate_sizes"] == [6, 2], r  # the rollouts, then two reflect continuations on each rank
        assert r["rescore_sizes"] == [6], r  # rank 1 corrects 6 rows, rank 0 5 rows + 1 filler
        # S rows (4, 6, 8, 10, 11) score 1, A rows (2, 3) 0.5, R rows (1, 5, 7, 9) 0 (no answer), row 0 was correct
        assert r["global_rewards"] == [1.0, 0, 0.5, 0.5, 1.0, 0, 1.0, 0, 1.0, 0, 1.0, 1.0], r
        assert r["corrected"] == [11.0] and r["num_items_ok"] and r["params_agree"], r
