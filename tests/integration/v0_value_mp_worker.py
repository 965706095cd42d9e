"""Run by test_v0_value.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="v0_value" (2 processes × 4 rollouts, G = 4: two prompts per generation batch, one group per process)
and a table predictor, and checks that (a) both ranks selected the same prompts in the same order, (b) each rank
generated for its own slice of that selection, (c) both ranks hold the same context, equal to the global rewards'
success rates. Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from tests.integration.prompt_selection_mp_setup import TEXTS, G, lockstep_checks, train_with_selection_spy
from tests.integration.torchrun import run_worker
from trl_groupx.sampling import v0_value as v0_module

TABLE = [0.0, 0.2, 0.5, 1.0, 0.45, 0.9, 0.3, 0.05]  # p(1−p): 2, 4 first; then (2, 4 in context → 1.0) 6, 1


def check(out_dir: Path) -> dict:
    v0_module.register_value_predictor(
        "table", lambda cp, cl, tp: [1.0 if t in cp else TABLE[TEXTS.index(t)] for t in tp])
    run = train_with_selection_spy(out_dir, "v0_value", v0_module, "update_context", v0_value_predictor="table")
    state = run.trainer.variant_state["v0_value"]
    result = lockstep_checks(run, [state["context_index"].tolist(), state["context_rate"].tolist(), state["draws"]])
    expected_rates = [r for rewards in run.global_rewards for r in torch.tensor(rewards).view(-1, G).mean(1).tolist()]
    result["matches_replay"] = (state["context_index"].tolist() == [i for sel in run.selections for i in sel]
                                and torch.allclose(state["context_rate"],
                                                   torch.tensor(expected_rates, dtype=torch.float64)))
    return result


if __name__ == "__main__":
    run_worker(check)
