"""Run by test_s2l_po_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank loads the same perturbed
explorer; on an explorer batch each rank's completions are the ones a GRPO run of the explorer samples for its own
rows, on a learner batch they are plain GRPO's; a three-step run (N = 3: explorer, explorer, learner) takes the same
decision on both ranks at every step without hanging. Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.dgrpo_mp_worker import perturbed_teacher  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402

FLAG = "groupx/s2l_po_explorer_batch"


def one_batch(trainer, global_step=0):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer.state.global_step = global_step
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer._prepare_inputs(batch)


def trainer(out_dir, **flags):
    common = dict(per_device_train_batch_size=4, num_generations=8)  # groups of 8 straddle the two ranks
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir, **common, **flags)


def check(out_dir: Path) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    explorer = perturbed_teacher(out_dir / f"explorer{rank}")
    s2l = dict(rollout_filter="s2l_po", s2l_po_explorer_model=explorer, s2l_po_group_sizes="fixed")
    explorer_rows = one_batch(trainer(out_dir / "explorer_grpo", model=explorer))
    grpo_rows = one_batch(trainer(out_dir / "grpo"))
    on_explorer = one_batch(trainer(out_dir / "s2l_explorer", **s2l), global_step=0)
    on_learner = one_batch(trainer(out_dir / "s2l_learner", **s2l), global_step=2)
    run = trainer(out_dir / "run", s2l_po_anneal_steps=3, max_steps=3, **s2l)
    run.train()
    flags = {h["step"]: h[FLAG] for h in run.state.log_history if FLAG in h}
    return {
        "rank": rank,
        "explorer_rows": bool(torch.equal(on_explorer["completion_ids"], explorer_rows["completion_ids"])),
        "explorer_advantages": bool(torch.allclose(on_explorer["advantages"], explorer_rows["advantages"])),
        "not_policy_rows": not torch.equal(on_explorer["completion_ids"], grpo_rows["completion_ids"]),
        "learner_rows": bool(torch.equal(on_learner["completion_ids"], grpo_rows["completion_ids"])),
        "flags": flags,
    }


if __name__ == "__main__":
    run_worker(check)
