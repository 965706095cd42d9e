"""Run by test_vade.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="vade" (2 processes × 4 rollouts, G = 4: two prompts per generation batch, one group per process)
and checks that (a) both ranks selected the same prompts in the same order, (b) each rank generated for its own
slice of that selection, (c) both ranks hold the same posteriors, equal to a replay of the global rewards.
Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from tests.integration.prompt_selection_mp_setup import DATASET, G, lockstep_checks, train_with_selection_spy
from tests.integration.torchrun import run_worker
from trl_groupx.sampling import vade as vade_module
from trl_groupx.sampling.vade import vade_posterior_update


def check(out_dir: Path) -> dict:
    run = train_with_selection_spy(out_dir, "vade", vade_module, "vade_posterior_update")
    state = run.trainer.variant_state["vade"]
    result = lockstep_checks(run, [state["alpha"].tolist(), state["beta"].tolist(), state["draws"]])
    # replay on the global rewards: prior, then the two batches with the default decays
    alpha = torch.ones(len(DATASET), dtype=torch.float64)
    beta = torch.ones(len(DATASET), dtype=torch.float64)
    for sel, rewards in zip(run.selections, run.global_rewards):
        r = torch.tensor(rewards).view(-1, G)
        alpha, beta = vade_posterior_update(alpha, beta, torch.tensor(sel), (r >= 1.0).sum(1),
                                            torch.full((len(sel),), G), 0.99, 0.8)
    result["matches_replay"] = bool(torch.equal(state["alpha"], alpha) and torch.equal(state["beta"], beta))
    return result


if __name__ == "__main__":
    run_worker(check)
