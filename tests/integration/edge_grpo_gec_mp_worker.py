"""Run by test_edge_grpo_gec_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 × 6 rollouts in groups of 4,
so group 1 (global rows 4-7) spans both processes. Global row 0 scores 1, every other row 0; with seed 0 at step 0
the branches of the 12 rows are [S, R, A, A, S, R, S, R, S, R, S, S] (S solution, A answer, R reflect), so rank 0
corrects its rows 1-5 and rank 1 all six of its rows: both join one reflect generation call of 2 rows (rows 1, 5 and
7, 9) and one re-scoring call of 6 rows (rank 0 with one filler). Writes one JSON line per rank to the folder given as argv[1]."""

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
from trl_groupx.sampling.edge_grpo_gec import answer_suffix
from trl_groupx.toy import arithmetic_dataset

G, B = 4, 6
RANK = int(os.environ.get("RANK", "0"))
TEMPLATE = "!{answer}"
_BASE = arithmetic_dataset(64, seed=0)
DATASET = _BASE.add_column("solution", [f"={a}" for a in _BASE["answer"]])
CALLS: list[list[str]] = []


def _text(c):
    return c[-1]["content"] if isinstance(c, list) else c


def pattern_then_check(completions, answer, solution, **kwargs):
    """Generation calls (odd): global row 0 scores 1, every other row 0. Re-scoring calls: 1 for the solution, 0.5
    for the templated answer."""
    CALLS.append([_text(c) for c in completions])
    if len(CALLS) % 2 == 1:
        return [float(RANK == 0 and i == 0) for i in range(len(completions))]
    return [1.0 if _text(c) == s else 0.5 if _text(c).endswith(answer_suffix(a, TEMPLATE)) else 0.0
            for c, a, s in zip(completions, answer, solution)]


def main() -> None:
    out_dir = Path(sys.argv[1])
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run", dataset=DATASET,
                            reward_funcs=pattern_then_check, edge_grpo_gec=True, edge_grpo_gec_target_reward=1.0,
                            edge_grpo_gec_answer_template=TEMPLATE, edge_grpo_gec_reflect_cue="?",
                            token_weighting="edge_grpo",
                            shuffle_dataset=False, per_device_train_batch_size=B, max_completion_length=8, max_steps=1)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
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
        "rescore_sizes": [len(c) for c in CALLS[1::2]],
        "generate_sizes": generate_sizes,
        "global_rewards": rewards.tolist(),
        "corrected": list(trainer._metrics["train"]["groupx/gec_corrected"]),
        "num_items_ok": bool(output["num_items_in_batch"]
                             == trainer.accelerator.gather(output["completion_mask"].sum()).sum()),
    }
    CALLS.clear()
    trainer.train()  # one real step with GEC and EDA on both ranks
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    result["params_agree"] = all(s == sums[0] for s in sums)
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result))
    finish()


if __name__ == "__main__":
    main()
