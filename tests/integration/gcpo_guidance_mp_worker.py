"""Run by test_gcpo_guidance_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank runs one generation batch
(one group spans both ranks) through gcpo_guidance and checks that the global negative-prompt log-probs hold each
rank's own rows (an independent forward of its first row under its negative prompt), that its slice of the token
advantages is the global computation's slice, and that both ranks see the same global numbers. Writes one JSON line
per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.test_gcpo_guidance import SUFFIX, independent_negative_logps  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.contracts import config_kwargs  # noqa: E402


def check(out_dir: Path) -> dict:
    group = 8  # 2 processes × 4 rollouts: one group spans both processes
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "gcpo",
                            per_device_train_batch_size=4, num_generations=group, token_weighting="gcpo_guidance")
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rank, local_n = trainer.accelerator.process_index, output["completion_ids"].size(0)
    rewards = trainer._rewards_per_func[:, 0]
    local = output["advantages"] * output["completion_mask"]
    width = trainer.accelerator.gather(torch.tensor([local.size(1)])).max().item()
    gathered = trainer.accelerator.gather(torch.nn.functional.pad(local, (0, width - local.size(1))))
    ctx = trainer._token_context(output, rewards, group)
    variant = trainer.variants["token_weights"]
    seq = trl_groupx.get_variant("grpo_deepseekmath").fn(rewards, group)
    expected = variant.fn(seq, ctx, **config_kwargs(variant.fn, trainer.args))[:, :width]
    # this rank's first row, scored independently under its negative prompt, sits at its global row
    row = rank * local_n
    n0 = int(output["completion_mask"][0].sum())
    prompt = batch[0]["prompt"]
    negative = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + SUFFIX}]
    own = independent_negative_logps(trainer, negative, output["completion_ids"][0, :n0])
    every_rank = gather_object([[gathered.tolist(), ctx.contrast_logps.tolist()]])
    return {
        "rank": rank,
        "n_global": int(rewards.numel()),
        "matches_formula": bool(torch.allclose(gathered, expected, atol=1e-5)),
        "own_row_negative_logps": bool(torch.allclose(ctx.contrast_logps[row, :n0], own, atol=1e-4, rtol=1e-4)),
        "ranks_agree": all(g == every_rank[0] for g in every_rank),
    }


if __name__ == "__main__":
    run_worker(check)
