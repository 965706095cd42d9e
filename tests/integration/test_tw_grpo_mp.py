"""tw_grpo on two processes: a group that spans both ranks gets the same divergence as a group held by one, each rank
computes its share of the groups (the same number of forwards on both), and both ranks hold the global numbers."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("tw_grpo_mp_worker.py")


@needs_torchrun
def test_tw_grpo_two_processes_agree(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["n_global"] == 12, r  # 2 processes × 6 rollouts were gathered
        assert r["spans"] and r["nonzero"], r
        assert r["forwards"] == 2, r  # groups 0 and 2 on rank 0; group 1 and one discarded forward on rank 1
        assert r["matches_independent"], r
        assert r["ranks_agree"], r
