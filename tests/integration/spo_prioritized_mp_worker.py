"""Run by test_spo_prioritized.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="spo_prioritized" (2 processes × 4 rollouts, G = 4: two prompts per generation batch, one group per
process) and checks that both ranks drew the same prompts in the same order, each generated for its own slice, and
both hold the same tracker and draw counter. Writes one JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer, parity_reward
from tests.integration.torchrun import finish
from trl_groupx.sampling import spo_prioritized as module
from trl_groupx.toy import arithmetic_dataset

G = 4


def main() -> None:
    out_dir = Path(sys.argv[1])
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    local_prompts, selections = [], []

    def reward(prompts, completions, **kwargs):
        local_prompts.append([p[-1]["content"] for p in prompts])
        return parity_reward(completions)

    reward.__name__ = "parity_reward"
    real_draw = module.spo_priority_draw

    def spy(weights, num_prompts, seed, draw):
        selections.append(real_draw(weights, num_prompts, seed, draw))
        return selections[-1]

    module.spo_priority_draw = spy
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "spo",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="spo_prioritized",
                            advantage_estimator="spo_single", dataset=data, max_steps=2, reward_funcs=[reward])
    trainer.train()
    rank = trainer.accelerator.process_index
    mine = all(local == [texts[sel[rank]]] * G for local, sel in zip(local_prompts, selections))
    tracker, state = trainer.variant_state["spo_single"], trainer.variant_state["spo_prioritized"]
    all_selections = gather_object([selections])
    all_states = gather_object([[tracker["keys"].tolist(), tracker["values"].tolist(), state["draws"],
                                 state["dataset_keys"].tolist()]])
    result = {
        "rank": rank,
        "selections": selections,
        "ranks_agree_on_selection": all(s == all_selections[0] for s in all_selections) and len(selections) == 2,
        "local_rows_are_my_slice": mine and len(local_prompts) == 2,
        "ranks_agree_on_state": all(s == all_states[0] for s in all_states) and state["draws"] == 2,
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
