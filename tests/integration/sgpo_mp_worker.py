"""Run by test_sgpo.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="sgpo" (2 processes × 4 rollouts, G = 4: two prompts per generation batch, one group per process)
and checks that (a) each rank profiled its own shard (one prompt per round: rank r prompts r, r + 2, r + 4, r + 6),
(b) both ranks hold the same p̂ and curriculum, equal to the scripted success rates and the curriculum derived in
test_sgpo.py, (c) each rank trained on its own slice of each curriculum batch.
Writes one JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer
from tests.integration.test_sgpo import CURRICULUM, SUCCESSES, ScriptedReward
from tests.integration.torchrun import finish
from trl_groupx.toy import arithmetic_dataset

G = 4


def main() -> None:
    out_dir = Path(sys.argv[1])
    data = arithmetic_dataset(8, seed=0)
    reward = ScriptedReward([row["prompt"][-1]["content"] for row in data])
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "sgpo",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="sgpo",
                            sgpo_unsolvable_keep=0.5, dataset=data, max_steps=2, reward_funcs=[reward])
    trainer.train()
    rank = trainer.accelerator.process_index
    state = trainer.variant_state["sgpo"]
    everyone = gather_object([[state["p_hat"].tolist(), state["order"].tolist(), state["served"]]])
    result = {
        "rank": rank,
        "calls": reward.calls,
        "ranks_agree": all(s == everyone[0] for s in everyone) and len(everyone) == 2,
        "p_hat_is_scripted": state["p_hat"].tolist() == [s / 4 for s in SUCCESSES],
        "order_is_curriculum": state["order"].tolist() == CURRICULUM and state["served"] == 4,
        "profiled_own_shard": reward.calls[:4] == [[2 * k + rank] * G for k in range(4)],
        "trained_own_slice": reward.calls[4:] == [[CURRICULUM[2 * b + rank]] * G for b in range(2)],
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
