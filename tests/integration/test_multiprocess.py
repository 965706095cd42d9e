"""Two processes (torchrun, gloo, CPU): every stage computes on the global batch and each rank keeps its slice."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("mp_worker.py")


@needs_torchrun
def test_two_processes_compute_global_stages(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 8
    for r in results:
        assert r["n_global"] in (8,), r  # 2 processes × 4 rollouts were gathered
        assert r["matches_formula"], r
        assert r["ranks_agree_on_rewards"], r
