"""Two-process CPU (gloo) runs for the multi-process tests: one launcher for the test side, one clean exit for the
worker side.

A worker that returns from `main()` with its gloo process group still alive can abort at interpreter exit
("terminate called without an active exception", SIGABRT) after its results are written; `finish()` makes every
rank wait for the others and tears the group down first, so a non-zero exit code always means a real failure."""

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_torchrun = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")


def free_port() -> str:
    """A port nobody holds now: several suites (or CI runs) may share this machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def launch(worker: Path, *args: str, timeout: int = 600) -> None:
    """Run `worker` under `torchrun --nproc_per_node 2`; a hang or a non-zero exit fails the calling test with
    the tail of both streams."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", free_port(),
           str(worker), *map(str, args)]
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def finish() -> None:
    """Worker side, last call of `__main__`: all ranks meet, then the process group is destroyed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    # The results are written: leave without the interpreter's teardown, where a still-joinable native thread
    # (gloo, tokenizers) can abort the process ("terminate called without an active exception") after the fact.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_worker(check: Callable[[Path], dict]) -> None:
    """Worker side, the whole `__main__`: `check(out_dir)` (out_dir = argv[1]) is written as this rank's
    `rank{RANK}.jsonl`, then `finish()`."""
    out_dir = Path(sys.argv[1])
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(check(out_dir)))
    finish()
