"""Run by test_srpo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): groups of 8 split over the two ranks (4
rows each), so a failed row's correct sibling may sit on the other rank. Each rank checks that its routed rows are
those of the global rewards, that the entropy weights average 1 over both ranks' distillation tokens, and that a step
trains. Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.objective.self_teacher import route  # noqa: E402


def check(out_dir: Path) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "srpo",
                            per_device_train_batch_size=4, num_generations=8, loss_type="srpo")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    out = trainer._generate_and_score_completions(batch)  # this rank's rows, in global order
    rewards = trainer._rewards_per_func.squeeze(1)  # (8,): both ranks' rows
    expected = route(rewards, 8, 1.0)[rank * 4 : rank * 4 + 4]
    weights, mask = out["groupx_srpo_weights"], out["completion_mask"] * out["groupx_srpo_routed"][:, None]
    sums = gather_object([[weights.sum().item(), mask.sum().item()]])
    routed_anywhere = sum(n for _, n in sums) > 0
    loss = trainer.compute_loss(trainer.model, out)
    loss.backward()
    return {
        "rank": rank,
        "routing": torch.equal(out["groupx_srpo_routed"], expected),
        "routed_anywhere": routed_anywhere,
        "global_mean_one": (not routed_anywhere) or abs(sum(s for s, _ in sums) / sum(n for _, n in sums) - 1) < 1e-5,
        "finite": bool(torch.isfinite(loss)) and all(
            torch.isfinite(p.grad).all().item() for p in trainer.model.parameters() if p.grad is not None),
    }


if __name__ == "__main__":
    run_worker(check)
