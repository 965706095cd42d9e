"""Run by test_eframe_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): EFRame with one all-fail group of 4 split
over the two ranks (2 rows each). Every batch, both ranks make one extra generate call of the same size (rank 0 the
hard prompt's 5 extra rollouts, rank 1 a discarded repeat); the one kept extra row plus a null row are dealt out
1 + 1; the buffer (1 row a batch, capacity 4) is identical on both ranks and is replayed whole at the 4th batch
(4 rows + the extra row + a null row, 3 a rank). Writes one JSON line per rank to the folder given as argv[1]."""

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
from trl_groupx.toy import arithmetic_dataset  # noqa: E402

EXTRA_N = 5


def scripted_reward(completions, **kwargs):
    """On-policy rows (2 a rank) all fail; in an extra call (5 rows a rank) the first rollout of the block succeeds."""
    if len(completions) == EXTRA_N:
        return [float(i == 0) for i in range(EXTRA_N)]
    return [0.0] * len(completions)


def check(out_dir: Path) -> dict:
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run",
                            dataset=arithmetic_dataset(1, seed=0), num_generations=4, per_device_train_batch_size=2,
                            reward_funcs=scripted_reward, rollout_filter="eframe", eframe_extra_n=EXTRA_N,
                            eframe_replay_freq=4, eframe_replay_size=1.0, loss_type="grpo", shuffle_dataset=False,
                            max_steps=4)
    calls, batches = [], []
    generate_single = trainer._generate_single_turn

    def spy(prompt_ids, *args, **kwargs):
        calls.append((len(prompt_ids), trainer.generation_config.temperature))
        return generate_single(prompt_ids, *args, **kwargs)

    generate = trainer._generate_and_score_completions

    def recording(inputs):
        output = generate(inputs)
        mask = output["completion_mask"]
        batches.append({
            "rows": int(mask.size(0)),
            "trained_rows": int((mask.sum(-1) > 0).sum()),
            "num_items_ok": bool(output["num_items_in_batch"] == trainer.accelerator.gather(mask.sum()).sum()),
        })
        return output

    trainer._generate_single_turn = spy
    trainer._generate_and_score_completions = recording
    trainer.train()
    state = trainer.variant_state["eframe"]
    summary = [state["batches"], state["buffer"]["advantages"],
               [[t.tolist() for t in state["buffer"][name]] for name in ("prompt_ids", "completion_ids", "logps")]]
    states = gather_object([summary])
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    return {
        "calls": calls,
        "batches": batches,
        "buffer_rows": len(state["buffer"]["advantages"]),
        "replayed": [h["groupx/eframe_replayed_rows"] for h in trainer.state.log_history
                     if "groupx/eframe_replayed_rows" in h],
        "states_agree": all(s == states[0] for s in states),
        "params_agree": all(s == sums[0] for s in sums),
        "finite": all(torch.isfinite(p).all().item() for p in trainer.model.parameters()),
    }


if __name__ == "__main__":
    run_worker(check)
