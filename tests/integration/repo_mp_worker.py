"""Run by test_repo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): RePO with one group of 4 split over the two
ranks (2 rows each). The buffer is global and identical on both ranks; from the second batch on, the 3 replayed
rows of the prompt plus one null row are dealt out 2 + 2, so every rank trains on 4 rows. Writes one JSON line per
rank to the folder given as argv[1]."""

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
                            rollout_filter="repo", repo_k=3, repo_min_cache=4, repo_max_cache=8, loss_type="grpo",
                            shuffle_dataset=False, max_steps=3)
    batches = []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        output = generate(inputs)
        mask = output["completion_mask"]
        replay = output["groupx_replay"].bool()
        rollouts = [ids[: int(m.sum())].tolist() for ids, m in zip(output["completion_ids"], mask)]
        batches.append({
            "rows": int(mask.size(0)),
            "replayed": int(replay.sum()),
            "null_rows": int((replay & (mask.sum(-1) == 0)).sum()),
            "num_items_ok": bool(output["num_items_in_batch"] == trainer.accelerator.gather(mask.sum()).sum()),
            "on_policy": gather_object([r for r, f in zip(rollouts, replay.tolist()) if not f]),
            "replayed_rows": gather_object([r for r, f in zip(rollouts, replay.tolist()) if f and r]),
        })
        return output

    trainer._generate_and_score_completions = recording
    trainer.train()
    state = trainer.variant_state["repo"]
    summary = (state["order"], [[e[name].tolist() for name in ("completion_ids", "logps", "lengths", "rewards")]
                                for e in state["prompts"].values()])
    states = gather_object([summary])
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    result = {
        "rank": RANK,
        "batches": [{k: v for k, v in b.items() if k not in ("on_policy", "replayed_rows")} for b in batches],
        "replayed_from_first": all(r in batches[0]["on_policy"] for r in batches[1]["replayed_rows"]),
        "replayed_count": [len(b["replayed_rows"]) for b in batches],
        "buffer_sizes": [e["rewards"].shape[0] for e in state["prompts"].values()],
        "states_agree": all(s == states[0] for s in states),
        "params_agree": all(s == sums[0] for s in sums),
        "finite": all(torch.isfinite(p).all().item() for p in trainer.model.parameters()),
    }
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
