"""Run by test_spo_segment_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank runs one generation batch
(one group spans both ranks) through spo_segment with rank 1 keeping a single cut point, and checks that both ranks
made the same generate calls (count, size, max_new_tokens), hold the same global Monte-Carlo values (NaN exactly off
the cuts each rank chose), and that its slice of the token advantages is the global computation's slice. Writes one
JSON line per rank to the folder given as argv[1]."""

import dataclasses
import functools
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.test_spo_segment import FLAGS  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.contracts import config_kwargs  # noqa: E402
from trl_groupx.token_weights import spo_segment_rollouts  # noqa: E402


def check(out_dir: Path) -> dict:
    group = 8  # 2 processes × 4 rollouts: one group spans both processes
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "spo", max_completion_length=6,
                            per_device_train_batch_size=4, num_generations=group, temperature=1.5, **FLAGS)
    trainer.model.train()
    rank = trainer.accelerator.process_index
    chosen = {}  # local row -> cuts this rank asked for
    real_cuts = spo_segment_rollouts.cut_points

    def cut_points(logps, length, *args):
        cuts = real_cuts(logps, length, *args)
        if rank == 1:  # rank 1 keeps one cut of its first row with any: far fewer continuations than rank 0
            cuts = cuts[:1] if not any(chosen.values()) else []
        chosen[len(chosen)] = cuts
        return cuts

    requests = {}
    real_plan = spo_segment_rollouts.plan_requests

    def plan_requests(*args):
        planned = real_plan(*args)
        requests["n"] = len(planned[0])  # distinct prefixes (rows of a group sharing one are continued once)
        return planned

    calls = []
    real_generate = trainer._generate_single_turn

    def generate(prompt_ids, *args):
        if trainer._generating_baseline:
            calls.append([len(prompt_ids), int(trainer.generation_config.max_new_tokens)])
        return real_generate(prompt_ids, *args)

    seen = {}
    variant = trainer.variants["token_weights"]

    @functools.wraps(variant.fn)
    def fn(advantages, ctx, **kwargs):
        seen["ctx"] = ctx
        return variant.fn(advantages, ctx, **kwargs)

    trainer.variants["token_weights"] = dataclasses.replace(variant, fn=fn)
    trainer._generate_single_turn = generate
    spo_segment_rollouts.cut_points, spo_segment_rollouts.plan_requests = cut_points, plan_requests
    torch.manual_seed(1)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    spo_segment_rollouts.cut_points, spo_segment_rollouts.plan_requests = real_cuts, real_plan
    ctx, local_n = seen["ctx"], output["completion_ids"].size(0)
    values = ctx.segment_mc_values
    # NaN exactly off the cuts this rank chose for its own rows
    own_rows = range(rank * local_n, (rank + 1) * local_n)
    off_cut_nan = all(
        (not math.isnan(values[g, j])) == (j in chosen[g - rank * local_n])
        for g in own_rows for j in range(values.size(1))
    )
    local = output["advantages"] * output["completion_mask"]
    width = trainer.accelerator.gather(torch.tensor([local.size(1)])).max().item()
    gathered = trainer.accelerator.gather(torch.nn.functional.pad(local, (0, width - local.size(1))))
    expected = variant.fn(torch.zeros(group * 1), ctx, **config_kwargs(variant.fn, trainer.args))[:, :width]
    every_rank = gather_object([[torch.nan_to_num(values, nan=99.0).tolist(), gathered.tolist(), calls]])
    cut_counts = gather_object([[sum(len(c) for c in chosen.values()), requests["n"]]])
    return {
        "rank": rank,
        "n_global": int(values.size(0)),
        "off_cut_nan": off_cut_nan,
        "matches_formula": bool(torch.allclose(gathered, expected, atol=1e-5)),
        "ranks_agree": all(g == every_rank[0] for g in every_rank),
        "cuts": [c[0] for c in cut_counts],
        "requests": [c[1] for c in cut_counts],
        "calls": calls,
    }


if __name__ == "__main__":
    run_worker(check)
