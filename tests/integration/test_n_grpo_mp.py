"""rollout_filter="n_grpo" on two processes: each rank's mixing records stay with its own rows through TRL's
shuffle and split (the old log-probs of generation are a replay of them), the ranks draw their own mixing steps, and
the mixed-token share is logged over both ranks."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("n_grpo_mp_worker.py")


@needs_torchrun
def test_each_rank_replays_its_own_rows(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert all(v for k, v in r.items() if k != "rank"), r
