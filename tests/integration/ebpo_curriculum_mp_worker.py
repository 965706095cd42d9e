"""Run by test_ebpo_curriculum.py under `torchrun --nproc_per_node 2` (gloo, CPU): rollout_filter="ebpo_curriculum"
with 2 processes × 4 rollouts, G = 4 (two prompts per generation batch, one group per process), two steps. Checks
that (a) each rank profiled its own shard (one prompt per round: rank r prompts r, r + 2, r + 4, r + 6), (b) both ranks
hold the scripted pass rates and the easy → hard stream of test_ebpo_curriculum.py, (c) each rank trained on its own
slice of each batch. Writes one JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer
from tests.integration.test_ebpo_curriculum import STREAM
from tests.integration.test_sgpo import SUCCESSES, ScriptedReward
from tests.integration.torchrun import finish
from trl_groupx.toy import arithmetic_dataset

G = 4


def main() -> None:
    out_dir = Path(sys.argv[1])
    data = arithmetic_dataset(8, seed=0)
    reward = ScriptedReward([row["prompt"][-1]["content"] for row in data])
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="ebpo_curriculum",
                            ebpo_curriculum_samples=4, dataset=data, max_steps=2, reward_funcs=[reward])
    trainer.train()
    rank = trainer.accelerator.process_index
    state = trainer.variant_state["ebpo_curriculum"]
    everyone = gather_object([[state["pass_rate"].tolist(), state["order"].tolist(), state["served"]]])
    result = {
        "rank": rank,
        "calls": reward.calls,
        "ranks_agree": len(everyone) == 2 and all(s == everyone[0] for s in everyone),
        "pass_rate_is_scripted": state["pass_rate"].tolist() == [s / 4 for s in SUCCESSES],
        "order_is_stream": state["order"].tolist() == STREAM and state["served"] == 4,
        "profiled_own_shard": reward.calls[:4] == [[2 * k + rank] * G for k in range(4)],
        "trained_own_slice": reward.calls[4:] == [[STREAM[2 * b + rank]] * G for b in range(2)],
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
