"""Multi-process check on a GPU machine (never run in CI): several processes with a share of the global batch each
train like one process with the whole batch, for one variant per stage and every stateful variant.

    python benchmarks/gpu/multiprocess_check.py            # GPUs: one process per GPU (2, 3, 4 or 6 of them), or
                                                           # 2 processes sharing GPU 0 (gloo) on a one-GPU machine
    python benchmarks/gpu/multiprocess_check.py --cpu      # the same on CPU (what tests/integration runs), a smoke test

Same harness as tests/integration/test_multiprocess_sharding.py (tests/integration/sharding_helpers.py): generation
is replaced by a deterministic function of (step, global rollout index), 2 training steps, global batch 12 in groups
of 4. The multi-process run goes through torchrun (NCCL with one process per GPU; gloo when processes share a GPU,
since NCCL refuses two ranks on one device); the reference is one process on GPU 0 (or CPU). Prints one line per
variant with the largest differences and exits 1 if any exceeds its tolerance. Takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _device_flags(cpu: bool, shared_gpu: bool) -> dict:
    if cpu:
        return {"use_cpu": True}
    return {"use_cpu": False, **({"ddp_backend": "gloo"} if shared_gpu else {})}


def worker(out_dir: Path, cpu: bool, shared_gpu: bool) -> None:
    """Under torchrun: every case, rank 0 writes its record."""
    if shared_gpu:  # every rank on GPU 0: accelerate picks the device from LOCAL_RANK
        os.environ["LOCAL_RANK"] = "0"
    import torch

    import tests.conftest  # noqa: F401  (offline environment)
    from tests.integration.sharding_helpers import CASES, run_job

    for name, flags in CASES.items():
        record = run_job(out_dir / name, {**flags, **_device_flags(cpu, shared_gpu)})
        if record is not None:
            torch.save(record, out_dir / f"{name}.pt")


def compare(single: dict, multi: dict) -> dict:
    """Largest differences: advantages (absolute), mean-over-ranks loss (absolute), weight update (relative to the
    update's size, per tensor)."""
    adv = max((a - b).abs().max().item() for a, b in zip(single["advantages"], multi["advantages"], strict=True))
    loss = max(abs(sum(b) / len(b) - a[0]) for a, b in zip(single["losses"], multi["losses"], strict=True))
    upd = max(
        ((single["deltas"][n] - multi["deltas"][n]).abs().max() / single["deltas"][n].abs().max().clamp(min=1e-12)).item()
        for n in single["deltas"]
    )
    return {"advantages": adv, "loss": loss, "update_rel": upd, "ranks_agree_on_state": multi["ranks_agree_on_state"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU with gloo (smoke test of this script)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shared-gpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.cpu, args.shared_gpu)
        return

    import torch

    gpus = 0 if args.cpu else torch.cuda.device_count()
    if not args.cpu and gpus == 0:
        sys.exit("no GPU visible: run with --cpu for the CPU version (tests/integration/test_multiprocess_sharding.py)")
    nproc = max([k for k in (2, 3, 4, 6) if k <= gpus], default=2)  # divides the global batch of 12
    shared_gpu = not args.cpu and gpus < 2
    out = Path(tempfile.mkdtemp(prefix="groupx-mp-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", "29611",
           __file__, "--worker", str(out / "multi")]
    cmd += ["--cpu"] * args.cpu + ["--shared-gpu"] * shared_gpu
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"{nproc} processes ({'CPU' if args.cpu else 'GPU 0, gloo' if shared_gpu else f'{nproc} GPUs, NCCL'})",
          flush=True)
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-6000:])
        sys.exit(f"torchrun failed with exit code {proc.returncode}")

    import tests.conftest  # noqa: F401
    from tests.integration.sharding_helpers import CASES, run_job

    tolerance = {"advantages": 2e-3, "loss": 1e-4, "update_rel": 2e-2}  # token-level weights carry entropy noise
    failed = False
    for name, flags in CASES.items():
        single = run_job(out / "single" / name, {**flags, **_device_flags(args.cpu, False)})
        multi = torch.load(out / "multi" / f"{name}.pt", weights_only=False)
        result = compare(single, multi)
        ok = result["ranks_agree_on_state"] and all(result[k] <= tol for k, tol in tolerance.items())
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:22s} {json.dumps(result)}", flush=True)
    print(f"records in {out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
