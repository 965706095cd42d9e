"""DaGRPO on two processes: a group straddles the ranks, each group is scored by one rank only, and both ranks mask
with every group's similarities (dagrpo_mp_worker.py)."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("dagrpo_mp_worker.py")


@needs_torchrun
def test_dagrpo_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        failed = [k for k, v in r.items() if k != "rank" and not v]
        assert not failed, (failed, r)
