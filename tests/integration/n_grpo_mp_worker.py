"""Run by test_n_grpo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank generates its slice of a
generation batch with `rollout_filter="n_grpo"`; its mixing records must be its own rows' (the old log-probs TRL
computed at generation equal a replay of the records the rank's micro-batch carries and differ from a plain forward),
the ranks draw different mixing steps, and the logged mixed-token share is the same global number on both. Writes one
JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer, one_step  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.sampling.neighbor_mixing import WEIGHTS_KEY, set_loss_replay  # noqa: E402


def _logps(trainer, inputs, replay):
    set_loss_replay(trainer, inputs if replay else {})
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask,
                                                                 inputs["completion_ids"].size(1))
    return logps


def check(out_dir: Path) -> dict:
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "n_grpo",
                            per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                            steps_per_generation=2, rollout_filter="n_grpo", n_grpo_mix_rate=0.5)
    loss, grads, inputs = one_step(trainer)
    mask = inputs["completion_mask"].bool()
    old = inputs["old_per_token_logps"]
    mixed = inputs[WEIGHTS_KEY].sum(-1) > 0
    pattern = gather_object([mixed.int().tolist()])
    share = gather_object([trainer._metrics["train"]["n_grpo/mixed_token_fraction"]])
    return {
        "rank": trainer.accelerator.process_index,
        "finite": bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads.values()),
        "replay_matches_old": torch.allclose(_logps(trainer, inputs, True)[mask], old[mask], atol=1e-5),
        "plain_differs": not torch.allclose(_logps(trainer, inputs, False)[mask], old[mask], atol=1e-4),
        "ranks_draw_differently": pattern[0] != pattern[1],
        "share_agrees": share[0] == share[1] and len(share[0]) == 1 and 0 < share[0][0] < 1,
    }


if __name__ == "__main__":
    run_worker(check)
