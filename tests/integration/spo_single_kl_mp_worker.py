"""Run by test_spo_single_kl.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank runs two generation
batches of three prompts (a group straddles the two processes; three stored responses split 2 + 1 over the ranks)
with spo_single_rho_mode="kl", the weights moved identically on both ranks in between, and checks that (a) every
rank holds the same store and tracker, (b) the second batch's D per prompt equals this rank's own re-score of the
stored response. Writes one JSON line per rank to the folder given as argv[1]."""

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
from tests.integration.test_spo_single_kl import independent_d
from tests.integration.torchrun import finish
from trl_groupx.advantages import prompt_kl as prompt_kl_module
from trl_groupx.toy import arithmetic_dataset


def main() -> None:
    out_dir = Path(sys.argv[1])
    records, real = [], prompt_kl_module.compute_prompt_kl

    def spy(trainer, output, keys, rewards, store):
        expected = {k: independent_d(trainer, store[k]) for k in set(keys.tolist()) if k in store}
        d = real(trainer, output, keys, rewards, store)
        records.append((keys.tolist(), d.tolist(), expected))
        return d

    prompt_kl_module.compute_prompt_kl = spy
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "spo",
                            per_device_train_batch_size=6, num_generations=4, advantage_estimator="spo_single",
                            spo_single_rho_mode="kl", dataset=arithmetic_dataset(3, seed=0))
    trainer.model.train()
    rank = trainer.accelerator.process_index
    for step in range(2):
        torch.manual_seed(step)
        batch = next(iter(trainer.get_train_dataloader()))
        trainer._generate_and_score_completions(batch)
        with torch.no_grad():  # the same move on both ranks: a seeded perturbation instead of an optimizer step
            generator = torch.Generator().manual_seed(100 + step)
            for p in trainer.model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=generator))
    (keys1, d1, _), (keys2, d2, expected) = records
    store = trainer.variant_state["spo_single/prompt_kl"]
    state = trainer.variant_state["spo_single"]
    mine = [[k, {n: t.tolist() for n, t in store[k].items()}] for k in sorted(store)]
    all_stores = gather_object([mine])
    all_states = gather_object([[state["keys"].tolist(), state["values"].tolist()]])
    all_d = gather_object([d2])
    result = {
        "rank": rank,
        "num_stored": len(store),
        "first_all_new": all(d != d for d in d1),  # NaN: nothing stored before the first batch
        "second_all_found": set(keys2) == set(expected) and len(expected) == 3,
        "d_matches_own_rescore": all(abs(d - expected[k]) < 1e-5 for k, d in zip(keys2, d2)),
        "d_positive": all(d > 1e-4 for d in d2),
        "ranks_agree_on_store": all(s == all_stores[0] for s in all_stores),
        "ranks_agree_on_state": all(s == all_states[0] for s in all_states),
        "ranks_agree_on_d": all(d == all_d[0] for d in all_d),
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
