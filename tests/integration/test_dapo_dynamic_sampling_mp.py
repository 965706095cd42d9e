"""DAPO refill with two processes (torchrun, gloo, CPU): ranks needing different numbers of refill rounds run the
same generation calls (nothing hangs), each fills its own batch with mixed groups, and training continues."""

import json
from pathlib import Path

from tests.integration.torchrun import launch, needs_torchrun

WORKER = Path(__file__).with_name("dapo_mp_worker.py")


@needs_torchrun
def test_two_processes_refill_in_lockstep(tmp_path):
    launch(WORKER, tmp_path, timeout=300)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for r in results:
        # rank 0 was full after the first call, rank 1 after the fourth: both ran 4 generation calls
        assert r["calls"] == 4 and r["gen_batches"] == [4.0] and r["kept_groups"] == [4.0], r
        assert r["size"] == 8 and r["all_groups_mixed"] and r["advantages_match"], r
        assert r["refill_prompts_match"] and r["rows_match"] and r["num_items_ok"], r
        assert r["states_agree"] and r["params_agree"], r
    assert results[0]["global_rewards"] == results[1]["global_rewards"]
    # after the probe batch (3 rounds) and 2 training steps, the source advanced identically on both ranks
    # probe: 3 rounds; step 1 (CALLS reset, rank 1 needs calls 0-3 again): 3 rounds; step 2: 1 round; 4 prompts each
    assert results[0]["state"] == results[1]["state"] == {"epoch": 0, "position": 4 * (3 + 3 + 1)}
