"""Run by test_vade.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="vade" (2 processes × 4 rollouts, G = 4: two prompts per generation batch, one group per process)
and checks that (a) both ranks selected the same prompts in the same order, (b) each rank generated for its own
slice of that selection, (c) both ranks hold the same posteriors, equal to a replay of the global rewards.
Writes one JSON line per rank to the folder given as argv[1]."""

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
from trl_groupx.sampling import vade as vade_module
from trl_groupx.toy import arithmetic_dataset

G = 4


def main() -> None:
    out_dir = Path(sys.argv[1])
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    local_prompts = []

    def reward(prompts, completions, **kwargs):
        local_prompts.append([p[-1]["content"] for p in prompts])
        return parity_reward(completions)

    reward.__name__ = "parity_reward"
    selections, global_rewards = [], []
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "vade",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="vade", dataset=data,
                            max_steps=2, reward_funcs=[reward])
    real_update = vade_module.vade_posterior_update

    def spy(alpha, beta, prompts, successes, trials, slow, fast):
        selections.append(prompts.tolist())
        global_rewards.append(trainer._rewards_per_func[:, 0].tolist())
        return real_update(alpha, beta, prompts, successes, trials, slow, fast)

    vade_module.vade_posterior_update = spy
    trainer.train()
    rank = trainer.accelerator.process_index
    mine = all(local == [texts[sel[rank]]] * G for local, sel in zip(local_prompts, selections))
    # replay on the global rewards: prior, then the two batches with the default decays
    alpha = torch.ones(len(data), dtype=torch.float64)
    beta = torch.ones(len(data), dtype=torch.float64)
    for sel, rewards in zip(selections, global_rewards):
        r = torch.tensor(rewards).view(-1, G)
        alpha, beta = real_update(alpha, beta, torch.tensor(sel), (r >= 1.0).sum(1), torch.full((len(sel),), G),
                                  0.99, 0.8)
    state = trainer.variant_state["vade"]
    all_selections = gather_object([selections])
    all_states = gather_object([[state["alpha"].tolist(), state["beta"].tolist(), state["draws"]]])
    result = {
        "rank": rank,
        "selections": selections,
        "ranks_agree_on_selection": all(s == all_selections[0] for s in all_selections) and len(selections) == 2,
        "local_rows_are_my_slice": mine and len(local_prompts) == 2,
        "ranks_agree_on_state": all(s == all_states[0] for s in all_states),
        "matches_replay": bool(torch.equal(state["alpha"], alpha) and torch.equal(state["beta"], beta)),
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
