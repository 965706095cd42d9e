"""hapo_adaptive_temperature on two processes: the next batch's entropy statistics are taken over both ranks'
completion tokens (as the official code's driver-side statistics over the whole batch), the same on every rank."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("hapo_temperature_mp_worker.py")


@needs_torchrun
def test_statistics_are_global_and_equal_on_both_ranks(tmp_path):
    launch(WORKER, tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["matches_global"] and r["ranks_agree"] and r["scales_agree"], r
        assert r["global_tokens"] > r["local_tokens"] > 0, r
    assert not all(r["matches_local_only"] for r in results), results  # the gather matters on this batch
