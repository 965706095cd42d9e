"""Run by test_lspo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 × 6 rollouts in groups of 4, so group 1
(global rows 4-7) spans both processes. Group 0 is mixed; groups 1 and 2 are cliffs: rank 0 re-rolls 2 slots (global
4, 5), rank 1 re-rolls 6 (global 6-11), and both make one generate call of 6. Writes one JSON line per rank to the
folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from accelerate.utils import gather_object

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
from trl_groupx.sampling import lspo_scaffold

SFT: list[tuple[list, list, list[float]]] = []


def _every_reroll_succeeds(texts, **kwargs):
    """Re-roll scoring calls: every row 1."""
    return [1.0] * len(texts)


def check(out_dir: Path) -> dict:
    fit = lspo_scaffold.fit_scaffold

    def spy(trainer, model, prompts, targets):
        losses = fit(trainer, model, prompts, targets)
        SFT.append((prompts, targets, losses))
        return losses

    lspo_scaffold.fit_scaffold = spy
    reward = scripted_reward(_every_reroll_succeeds, name="scripted")
    trainer = rescoring_trainer(out_dir, solution_dataset(), reward, rollout_filter="lspo",
                                lspo_sft_learning_rate=1e-3)
    batch = first_batch(trainer)
    output = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0]
    prompts, targets, losses = SFT[0]
    result = {
        "rank": RANK,
        "reroll_scoring_sizes": [len(c) for c in reward.calls[1::2]],
        "global_rewards": rewards.tolist(),
        "sft_pairs": len(prompts),
        "sft": gather_object([(json.dumps(prompts), targets, losses)]),
        "advantages_match": bool(torch.allclose(output["advantages"], group_normalised_local(rewards))),
        "num_items_ok": num_items_ok(trainer, output),
    }
    reward.calls.clear()
    result["params_agree"] = params_agree_after_training(trainer)  # one real step with the scaffold on both ranks
    return result


if __name__ == "__main__":
    run_worker(check)
