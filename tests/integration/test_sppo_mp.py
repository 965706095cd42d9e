"""SPPO on two processes: each rank scores its own prompts, and the value model's BCE step (gradients summed over
ranks) leaves both ranks with the same weights, those of one step on the whole global batch."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("sppo_mp_worker.py")


@needs_torchrun
def test_sppo_two_processes(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["rows"] == 8, r  # 4 prompts per rank, one rollout each
        assert r["same_start"], r
        assert r["advantages_are_reward_minus_value"], r
        assert r["moved"], r
        assert r["matches_one_process_step"], r
        assert r["ranks_agree"], r
        assert r["finite_loss"], r
