"""SRPO on two processes: a group split over the ranks is routed from the global rewards (the teacher prompts are
built from gathered completions), the entropy weights are normalised over both ranks' distillation tokens, and ranks
with different numbers of routed rows run the same number of teacher forwards (no hang)."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("srpo_mp_worker.py")


@needs_torchrun
def test_srpo_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["routing"], r
        assert r["routed_anywhere"], r
        assert r["global_mean_one"], r
        assert r["finite"], r
