"""NAT under two processes (torchrun, gloo, CPU): both ranks draw the same token selection from (seed, global step),
and each keeps its slice of the global Horvitz–Thompson token advantages."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("nat_mp_worker.py")


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_nat_two_processes_agree(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29547",
           str(WORKER), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["n_global"] == 8, r  # 2 processes × 4 rollouts were gathered
        assert r["matches_formula"], r
        assert r["ranks_agree"], r
        assert r["some_dropped"], r
