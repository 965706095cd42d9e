"""RTO on two processes: DPO-model log-probs computed per rank on its own rows, gathered into the global token
context, and each rank's slice of the token advantages matching an independent recomputation (rto_mp_worker.py)."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("rto_mp_worker.py")


@needs_torchrun
def test_rto_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["same_rollouts"], r
        assert r["own_rows"], r
        assert r["token_rewards"], r
        assert r["finite_loss"], r
