"""Run by test_multiprocess_sharding.py under `torchrun --nproc_per_node 2` (gloo, CPU). argv: output folder, then
optionally a single-process checkpoint to resume from. Trains every case of sharding_helpers.CASES for 2 steps (the
checkpoint case saving each step), resumes the checkpoint case from the given checkpoint if any, runs the FSDP2
one-step cases, and writes rank 0's records to `<folder>/<job>.pt`."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import tests.conftest  # noqa: F401  (offline environment variables)
from tests.integration.sharding_helpers import CASES, CHECKPOINT_CASE, FSDP2_CASES, fsdp2_one_step, run_job
from tests.integration.torchrun import finish


def main() -> None:
    out_dir = Path(sys.argv[1])
    jobs = {name: {"flags": flags, "save": name == CHECKPOINT_CASE} for name, flags in CASES.items()}
    if len(sys.argv) > 2:
        jobs["resumed"] = {"flags": CASES[CHECKPOINT_CASE], "resume_from": sys.argv[2]}
    for name, job in jobs.items():
        record = run_job(out_dir / name, **job)
        if record is not None:
            torch.save(record, out_dir / f"{name}.pt")
    for name, flags in FSDP2_CASES.items():
        record = fsdp2_one_step(out_dir / f"fsdp2_{name}", flags)
        if record is not None:
            torch.save(record, out_dir / f"fsdp2_{name}.pt")


if __name__ == "__main__":
    main()
    finish()
