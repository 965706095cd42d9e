"""LSPO with two processes (torchrun, gloo, CPU): a cliff group spanning both processes, the same SFT set, losses and
global rewards on every rank, equal-size re-roll calls, and a training step that keeps the ranks in sync."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("lspo_mp_worker.py")


@needs_torchrun
def test_two_processes_scaffold_in_lockstep(tmp_path):
    launch(WORKER, tmp_path, timeout=300)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        # both ranks score 6 re-rolls (rank 0: its 2 cliff slots + 4 fillers; rank 1: its 6 cliff slots)
        assert r["reroll_scoring_sizes"] == [6], r
        # every re-roll succeeds; at most G - 1 = 3 per cliff group: rows 4, 5, 6 and 8, 9, 10
        assert r["global_rewards"] == [1.0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0], r
        # one SFT pair per cliff group (group 1 counted once although it spans the ranks), identical on both
        # ranks, with identical losses: the two scaffolds are the same
        assert r["sft_pairs"] == 2 and r["sft"][0] == r["sft"][1], r
        assert r["advantages_match"] and r["num_items_ok"] and r["params_agree"], r
