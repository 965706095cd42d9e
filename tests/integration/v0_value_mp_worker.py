"""Run by test_v0_value.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="v0_value" (2 processes × 4 rollouts, G = 4: two prompts per generation batch, one group per process)
and a table predictor, and checks that (a) both ranks selected the same prompts in the same order, (b) each rank
generated for its own slice of that selection, (c) both ranks hold the same context, equal to the global rewards'
success rates. Writes one JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer, parity_reward
from tests.integration.torchrun import finish
from trl_groupx.sampling import v0_value as v0_module
from trl_groupx.toy import arithmetic_dataset

G = 4
TABLE = [0.0, 0.2, 0.5, 1.0, 0.45, 0.9, 0.3, 0.05]  # p(1−p): 2, 4 first; then (2, 4 in context → 1.0) 6, 1


def main() -> None:
    out_dir = Path(sys.argv[1])
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    v0_module.register_value_predictor(
        "table", lambda cp, cl, tp: [1.0 if t in cp else TABLE[texts.index(t)] for t in tp])
    local_prompts = []

    def reward(prompts, completions, **kwargs):
        local_prompts.append([p[-1]["content"] for p in prompts])
        return parity_reward(completions)

    reward.__name__ = "parity_reward"
    selections, global_rewards = [], []
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "v0_value",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="v0_value",
                            v0_value_predictor="table", dataset=data, max_steps=2, reward_funcs=[reward])
    real_update = v0_module.update_context

    def spy(index, rate, prompts, successes, trials, size):
        selections.append(prompts.tolist())
        global_rewards.append(trainer._rewards_per_func[:, 0].tolist())
        return real_update(index, rate, prompts, successes, trials, size)

    v0_module.update_context = spy
    trainer.train()
    rank = trainer.accelerator.process_index
    mine = all(local == [texts[sel[rank]]] * G for local, sel in zip(local_prompts, selections))
    expected_rates = [r for rewards in global_rewards for r in torch.tensor(rewards).view(-1, G).mean(1).tolist()]
    state = trainer.variant_state["v0_value"]
    all_selections = gather_object([selections])
    all_states = gather_object([[state["context_index"].tolist(), state["context_rate"].tolist(), state["draws"]]])
    result = {
        "rank": rank,
        "selections": selections,
        "ranks_agree_on_selection": all(s == all_selections[0] for s in all_selections) and len(selections) == 2,
        "local_rows_are_my_slice": mine and len(local_prompts) == 2,
        "ranks_agree_on_state": all(s == all_states[0] for s in all_states),
        "matches_replay": state["context_index"].tolist() == [i for sel in selections for i in sel]
        and torch.allclose(state["context_rate"], torch.tensor(expected_rates, dtype=torch.float64)),
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
