"""Run by test_chunked_logps.py under `torchrun --nproc_per_node 2` (gloo, CPU): one real `trainer.train()` step
(DDP-wrapped model, SGD) with and without `logps_chunk_size`; writes each rank's weights before and after the step
to argv[1]/rank{r}.pt. Equal weights on both ranks, and with and without the flag, show that the chunked path runs
inside DDP's forward (gradients are all-reduced) and computes TRL's gradient."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trl_groupx
from tests.conftest import build_trainer
from tests.integration.torchrun import finish


def train(out_dir: Path, chunk):
    trainer = build_trainer(
        trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir, per_device_train_batch_size=4, num_generations=4,
        optim="sgd", learning_rate=0.5, logps_chunk_size=chunk,
    )
    wrapped = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(model, *args, **kwargs):
        wrapped.append(type(model).__name__)
        return original(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = spy
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters()}
    return params, wrapped, initial


if __name__ == "__main__":
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    plain, _, initial = train(out / "plain", None)
    chunked, wrapped, _ = train(out / "chunked", 3)
    torch.save({"plain": plain, "chunked": chunked, "wrapped": wrapped, "initial": initial}, out / f"rank{rank}.pt")
    finish()
