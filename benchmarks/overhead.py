"""Median step-time ratio of trl_groupx variants against plain TRL, interleaved in one process (CPU, tiny model).

    python benchmarks/overhead.py --steps 20

A variant that adds nothing to the math (no flag set) should sit at ~1.00; the rest report what they add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_key, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import trl  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402

CASES = {
    "no flag": {},
    "sign_adv": {"advantage_estimator": "sign_adv"},
    "gtpo_entropy": {"token_weighting": "gtpo_entropy"},
    "gmpo": {"loss_type": "gmpo"},
}


def timed_step(trainer, step: int) -> float:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(step)
    batch = next(iter(trainer.get_train_dataloader()))
    start = time.perf_counter()
    inputs = trainer._prepare_inputs(batch)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    trainer.model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    ns = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp())
    print(f"{'variant':<16} {'median ratio vs TRL':>20}")
    for name in ns.cases:
        base_flags = {"loss_type": "grpo"} if "loss_type" in CASES[name] else {}
        theirs = build_trainer(trl.GRPOTrainer, trl.GRPOConfig, tmp / "trl", **base_flags)
        ours = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp / "ours", **CASES[name])
        ratios = []
        for step in range(ns.steps):  # interleaved, so drift in machine load hits both equally
            t_theirs, t_ours = timed_step(theirs, step), timed_step(ours, step)
            ratios.append(t_ours / t_theirs)
        print(f"{name:<16} {statistics.median(ratios):>20.3f}")


if __name__ == "__main__":
    main()
