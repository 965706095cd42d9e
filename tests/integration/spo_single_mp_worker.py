"""Run by test_spo_single.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank runs two generation batches
with advantage_estimator="spo_single" and checks that (a) the prompt keys of one group agree across the two
processes, (b) its advantages are its slice of the global formula, (c) every rank holds the same tracker.
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
from tests.conftest import build_trainer
from tests.integration.torchrun import finish
from trl_groupx.advantages import _prompt_keys
from trl_groupx.advantages.spo_single import spo_single_advantages
from trl_groupx.toy import arithmetic_dataset


def main() -> None:
    out_dir = Path(sys.argv[1])
    recorded, real = [], _prompt_keys.prompt_keys_from_ids

    def spy(ids, mask):
        keys = real(ids, mask)
        recorded.append(keys)
        return keys

    _prompt_keys.prompt_keys_from_ids = spy
    # 2 processes × 4 rollouts, G = 8: the one group of a step spans both processes
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "spo",
                            per_device_train_batch_size=4, num_generations=8, advantage_estimator="spo_single",
                            dataset=arithmetic_dataset(2, seed=0))
    trainer.model.train()
    rank = trainer.accelerator.process_index
    replay, ok_adv, ok_keys = {}, True, True
    for step in range(2):
        torch.manual_seed(step)
        batch = next(iter(trainer.get_train_dataloader()))
        output = trainer._generate_and_score_completions(batch)
        keys, rewards = recorded[-1], trainer._rewards_per_func[:, 0]
        ok_keys &= bool(keys.numel() == 8 and (keys == keys[0]).all())
        expected = spo_single_advantages(rewards, 8, prompt_keys=keys, state=replay)
        gathered = trainer.accelerator.gather(output["advantages"])
        ok_adv &= bool(torch.allclose(gathered, expected.to(gathered), atol=1e-6))
    state = trainer.variant_state["spo_single"]
    all_states = gather_object([[state["keys"].tolist(), state["values"].tolist()]])
    result = {
        "rank": rank,
        "keys_agree_within_group": ok_keys,
        "matches_formula": ok_adv,
        "matches_replay": bool(torch.equal(state["keys"], replay["keys"]) and torch.equal(state["values"], replay["values"])),
        "ranks_agree_on_state": all(s == all_states[0] for s in all_states),
        "num_prompts": int(state["keys"].numel()),
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
