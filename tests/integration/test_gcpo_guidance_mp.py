"""gcpo_guidance on two processes: the negative-prompt log-probs are computed per rank and gathered like the other
token inputs, so every rank computes the same global token advantages and keeps its own slice."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("gcpo_guidance_mp_worker.py")


@needs_torchrun
def test_gcpo_guidance_two_processes_agree(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["n_global"] == 8, r  # 2 processes × 4 rollouts were gathered
        assert r["matches_formula"], r
        assert r["own_row_negative_logps"], r
        assert r["ranks_agree"], r
