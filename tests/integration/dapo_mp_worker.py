"""Run by test_dapo_dynamic_sampling_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): the ranks need different
numbers of refill rounds (rank 0: none, rank 1: three); every rank must run the same generation calls, fill its own
batch with mixed groups, and train on. Writes one JSON line per rank to the folder given as argv[1]."""

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
from trl_groupx.sampling.dapo_dynamic_sampling import draw_refill_indices
from trl_groupx.toy import arithmetic_dataset

G = 4
RANK = int(os.environ.get("RANK", "0"))
DATASET = arithmetic_dataset(64, seed=0)
CALLS: list[list[str]] = []


def rank_dependent(prompts, completions, **kwargs):
    """Rank 0: both groups [1,0,0,0] (mixed) on every call. Rank 1: all equal on calls 0-1, then only group 1 mixed,
    so rank 1 needs calls 2 and 3 to fill its 2 groups while rank 0 is full after call 0."""
    CALLS.append([p[-1]["content"] for p in prompts])
    call = len(CALLS) - 1
    if RANK == 0:
        return [float(i % G == 0) for i in range(len(completions))]
    if call < 2:
        return [1.0] * len(completions)
    return [1.0 if i < G else float(i == G) for i in range(len(completions))]


def main() -> None:
    out_dir = Path(sys.argv[1])
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run", dataset=DATASET,
                            reward_funcs=rank_dependent, rollout_filter="dapo_dynamic_sampling", loss_type="dapo",
                            shuffle_dataset=False, max_steps=2)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    metrics = trainer._metrics["train"]
    rewards = trainer._rewards_per_func[:, 0]
    local = rewards[RANK * 8 : (RANK + 1) * 8]
    r = local.view(-1, G)
    expected_adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
    state = {}  # 3 refill rounds, each 2 processes x 2 groups
    refill = [draw_refill_indices(state, len(DATASET), 4, seed=0) for _ in range(3)]
    mine = [[DATASET[i]["prompt"][-1]["content"] for i in rnd[2 * RANK : 2 * RANK + 2] for _ in range(G)]
            for rnd in refill]
    if RANK == 0:
        expected_rows = CALLS[0]
    else:
        expected_rows = CALLS[2][G:] + CALLS[3][G:]
    result = {
        "rank": RANK,
        "calls": len(CALLS),
        "gen_batches": list(metrics["groupx/dapo_gen_batches"]),
        "kept_groups": list(metrics["groupx/dapo_kept_groups"]),
        "size": int(output["completion_ids"].size(0)),
        "global_rewards": rewards.tolist(),
        "all_groups_mixed": bool((rewards.view(-1, G).std(1) > 0).all()),
        "advantages_match": bool(torch.allclose(output["advantages"], expected_adv)),
        "refill_prompts_match": CALLS[1:4] == mine,
        "rows_match": bool([p[-1]["content"] for p in list(trainer._logs["prompt"])[RANK * 8 : (RANK + 1) * 8]]
                           == expected_rows),
        "num_items_ok": bool(output["num_items_in_batch"]
                             == trainer.accelerator.gather(output["completion_mask"].sum()).sum()),
    }
    CALLS.clear()
    trainer.train()  # two real steps; each rank needs a different number of rounds again
    result["state"] = trainer.variant_state["dapo_dynamic_sampling"]
    states = gather_object([result["state"]])
    result["states_agree"] = all(s == states[0] for s in states)
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    result["params_agree"] = all(s == sums[0] for s in sums)
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
