"""What the CPU memory benchmarks (chunked_logps, prefix_grouper, micro_groups) share: every case runs in a fresh
process with glibc's malloc pinned to return large blocks to the OS, and reports the resident-set high-water mark of
the measured call (VmHWM, reset through /proc/self/clear_refs) minus the resident set just before it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys


def status_kib(field: str) -> int:
    """A `/proc/self/status` field in KiB (`VmRSS`, `VmHWM`)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> int:
    """Collect garbage, reset VmHWM to the current resident set, and return that resident set (KiB)."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")


def run_case(script: str, case: str, argv: list[str]) -> dict:
    """Run `script --child case argv...` in a fresh process; its last stdout line is the case's JSON record."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    out = subprocess.run([sys.executable, script, "--child", case, *argv], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"case {case!r} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
