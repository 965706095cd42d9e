"""dGRPO on two processes: every rank loads the teacher and scores its own rows; the logged reverse KL is the mean
over both ranks' tokens."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("dgrpo_mp_worker.py")


@needs_torchrun
def test_dgrpo_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["own_rows"], r
        assert r["logged_is_global_mean"], r
        assert r["ranks_agree"], r
        assert r["disagrees"], r
        assert r["finite_loss"], r
