"""Run by test_gcpo_ref_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 × 6 rollouts in groups of 4, so
group 1 (global rows 4-7) spans both processes. Group 0 is mixed; groups 1 and 2 fail entirely, so their last rows
(global 7 and 11) both belong to rank 1, and rank 0 joins the re-scoring call with filler rows only. Writes one JSON
line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from tests.integration.rescoring_mp_setup import (
    RANK,
    first_batch,
    group_normalised_local,
    num_items_ok,
    params_agree_after_training,
    rescoring_trainer,
    scripted_reward,
    solution_dataset,
)
from tests.integration.torchrun import run_worker


def _exact_solution(texts, solution, **kwargs):
    """Re-scoring calls: exact match with the dataset's `solution`."""
    return [float(t == s) for t, s in zip(texts, solution)]


def check(out_dir: Path) -> dict:
    reward = scripted_reward(_exact_solution, name="pattern_then_exact")
    trainer = rescoring_trainer(out_dir, solution_dataset(), reward, rollout_filter="gcpo_ref")
    batch = first_batch(trainer)
    output = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0]
    tok = trainer.processing_class
    injected_local = [1, 5] if RANK == 1 else []
    refs_ok = all(
        output["completion_ids"][r, : len(ids)].tolist() == ids
        for r in injected_local
        for ids in [tok(batch[r]["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    )
    result = {
        "rank": RANK,
        "rescore_sizes": [len(c) for c in reward.calls[1::2]],
        "global_rewards": rewards.tolist(),
        "injected_groups": list(trainer._metrics["train"]["groupx/reference_injected_groups"]),
        "refs_ok": refs_ok,
        "advantages_match": bool(torch.allclose(output["advantages"], group_normalised_local(rewards))),
        "num_items_ok": num_items_ok(trainer, output),
    }
    reward.calls.clear()
    result["params_agree"] = params_agree_after_training(trainer)  # one real step with the injection on both ranks
    return result


if __name__ == "__main__":
    run_worker(check)
