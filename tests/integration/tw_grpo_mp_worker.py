"""Run by test_tw_grpo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 processes × 6 rollouts in groups of 4,
so the middle group spans both ranks and rank 1 computes one group while rank 0 computes two (rank 1 runs one
discarded forward so that both run two). Checks that every rank's `intra_group_token_divergence` equals `D_t`
recomputed here from each group's unpadded rows (gathered as token lists) by an independent forward and loops, and
that both ranks hold the same numbers. Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from trl.trainer.utils import pad  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.test_tw_grpo import TEMPERATURE, divergence_loops, independent_logps  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402


def check(out_dir: Path) -> dict:
    group = 4
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "tw",
                            per_device_train_batch_size=6, num_generations=group, token_weighting="tw_grpo",
                            temperature=TEMPERATURE)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rank = trainer.accelerator.process_index
    rewards = trainer._rewards_per_func[:, 0]
    calls = []
    original_forward = trainer.model.forward
    trainer.model.forward = lambda *a, **k: calls.append(1) or original_forward(*a, **k)
    ctx = trainer._token_context(output, rewards, group)
    trainer.model.forward = original_forward
    rows = [(p[m.bool()].tolist(), c[cm.bool()].tolist()) for p, m, c, cm in
            zip(output["prompt_ids"], output["prompt_mask"], output["completion_ids"], output["completion_mask"])]
    every_row = gather_object(rows)  # global order: rank 0's rows, then rank 1's
    n, width = ctx.completion_mask.shape
    expected = torch.zeros(n, width, dtype=torch.float64)
    for g in range(0, n, group):
        members = every_row[g:g + group]
        prompts = [torch.tensor(p) for p, _ in members]
        completions = [torch.tensor(c, dtype=torch.long) for _, c in members]
        sub = {
            "prompt_ids": pad(prompts, padding_value=0, padding_side="left"),
            "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
            "completion_ids": pad(completions, padding_value=0, padding_side="right"),
            "completion_mask": pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right"),
        }
        d = divergence_loops(independent_logps(trainer, sub), sub["completion_mask"], group)
        expected[g:g + group, :d.size(1)] = d
    every_rank = gather_object([ctx.intra_group_token_divergence.tolist()])
    return {
        "rank": rank,
        "n_global": int(n),
        "forwards": len(calls),
        "spans": bool(len({tuple(r[0]) for r in every_row[4:8]}) == 1),
        "nonzero": bool((expected != 0).any()),
        "matches_independent": bool(torch.allclose(ctx.intra_group_token_divergence.double(), expected,
                                                   atol=1e-4, rtol=1e-4)),
        "ranks_agree": all(g == every_rank[0] for g in every_rank),
    }


if __name__ == "__main__":
    run_worker(check)
