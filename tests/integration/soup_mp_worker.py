"""Run by test_soup.py under `torchrun --nproc_per_node 2` (gloo, CPU): rollout_filter="soup" with one group of 4
split over the two ranks (rows 0-1 on rank 0, rows 2-3 on rank 1), three steps. Rank 0 owns the stored slot (0),
rank 1 the mixed slot (3): from the second batch on, rank 1's last row must start with the prefix rank 0's first row
left in the buffer at the batch before, and the buffer, the mixed-row counts and the weights must agree on both
ranks. Writes one JSON line per rank to the folder given as argv[1]."""

import copy
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
from trl_groupx.toy import arithmetic_dataset

RANK = int(os.environ.get("RANK", "0"))


def main() -> None:
    out_dir = Path(sys.argv[1])
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run",
                            dataset=arithmetic_dataset(1, seed=0), num_generations=4, per_device_train_batch_size=2,
                            rollout_filter="soup", shuffle_dataset=False, max_steps=3, max_completion_length=12)
    prefix_kept, expected = [], []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        before = copy.deepcopy(trainer.variant_state["soup"].get("prompts", {}))
        output = generate(inputs)
        prefix = next(iter(before.values()))["ids"][0] if before else torch.zeros(0)
        expected.append(int(prefix.numel() > 0))  # an empty stored prefix (a one-token answer) mixes nothing
        if prefix.numel() and RANK == 1:  # this rank's second row is the group's mixed slot
            prefix_kept.append(output["completion_ids"][1, : prefix.numel()].cpu().equal(prefix))
        return output

    trainer._generate_and_score_completions = recording
    trainer.train()
    buffer = trainer.variant_state["soup"]["prompts"]
    states = gather_object([[[t.tolist() for t in e["ids"]] + [t.tolist() for t in e["logps"]]
                             for e in buffer.values()]])
    sums = gather_object([sum(p.detach().double().sum().item() for p in trainer.model.parameters())])
    result = {
        "rank": RANK,
        "mixed": [int(h["groupx/soup_mixed_rows"]) for h in trainer.state.log_history
                  if "groupx/soup_mixed_rows" in h],
        "expected": expected,
        "prefix_kept": all(prefix_kept) and (len(prefix_kept) == sum(expected) if RANK == 1 else not prefix_kept),
        "states_agree": len(states) == 2 and all(s == states[0] for s in states),
        "params_agree": all(s == sums[0] for s in sums),
        "finite": all(torch.isfinite(p).all().item() for p in trainer.model.parameters()),
    }
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
