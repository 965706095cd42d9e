"""SGPO's judge and VeriGate's step PRM on two processes: groups selected on the global rewards (one group straddles
the ranks), each rank's component called on its own rows of those groups only, the advantages computed from every
rank's scores (group_judges_mp_worker.py)."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("group_judges_mp_worker.py")


@needs_torchrun
def test_group_judges_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        failed = [k for k, v in r.items() if k != "rank" and not v]
        assert not failed, (failed, r)
