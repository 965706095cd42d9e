"""Run by test_edge_grpo_gec_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 × 6 rollouts in groups of 4,
so group 1 (global rows 4-7) spans both processes. Global row 0 scores 1, every other row 0; with seed 0 at step 0
the branches of the 12 rows are [S, R, A, A, S, R, S, R, S, R, S, S] (S solution, A answer, R reflect), so rank 0
corrects its rows 1-5 and rank 1 all six of its rows: both join one reflect generation call of 2 rows (rows 1, 5 and
7, 9) and one re-scoring call of 6 rows (rank 0 with one filler). Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.rescoring_mp_setup import (
    RANK,
    first_batch,
    num_items_ok,
    params_agree_after_training,
    rescoring_trainer,
    scripted_reward,
    solution_dataset,
)
from tests.integration.torchrun import run_worker
from trl_groupx.sampling.edge_grpo_gec import answer_suffix

TEMPLATE = "!{answer}"


def _solution_or_templated_answer(texts, answer, solution, **kwargs):
    """Re-scoring calls: 1 for the solution, 0.5 for the templated answer."""
    return [1.0 if t == s else 0.5 if t.endswith(answer_suffix(a, TEMPLATE)) else 0.0
            for t, a, s in zip(texts, answer, solution)]


def check(out_dir: Path) -> dict:
    reward = scripted_reward(_solution_or_templated_answer, name="pattern_then_check")
    trainer = rescoring_trainer(out_dir, solution_dataset(prefix="="), reward, edge_grpo_gec=True,
                                edge_grpo_gec_target_reward=1.0, edge_grpo_gec_answer_template=TEMPLATE,
                                edge_grpo_gec_reflect_cue="?", token_weighting="edge_grpo")
    batch = first_batch(trainer)
    generate_sizes = []
    original = trainer._generate_single_turn

    def spy(prompt_ids, *args, **kwargs):
        generate_sizes.append(len(prompt_ids))
        return original(prompt_ids, *args, **kwargs)

    trainer._generate_single_turn = spy
    output = trainer._generate_and_score_completions(batch)
    trainer._generate_single_turn = original
    rewards = trainer._rewards_per_func[:, 0]
    result = {
        "rank": RANK,
        "rescore_sizes": [len(c) for c in reward.calls[1::2]],
        "generate_sizes": generate_sizes,
        "global_rewards": rewards.tolist(),
        "corrected": list(trainer._metrics["train"]["groupx/gec_corrected"]),
        "num_items_ok": num_items_ok(trainer, output),
    }
    reward.calls.clear()
    result["params_agree"] = params_agree_after_training(trainer)  # one real step with GEC and EDA on both ranks
    return result


if __name__ == "__main__":
    run_worker(check)
