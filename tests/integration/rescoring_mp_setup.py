"""Setup shared by the two-process (torchrun, gloo, CPU) workers of the variants that rewrite rows of a training
batch after TRL scored it and score them again (GCPO reference injection, EDGE-GRPO GEC, LSPO scaffold re-rolls).

The layout: 2 processes × `B` = 6 rollouts in groups of `G` = 4, so group 1 (global rows 4-7) spans both processes;
the dataset is the toy arithmetic set, in order, with a `solution` column; the scripted reward gives global row 0 of
a generated batch reward 1 and every other generated row 0 (`FirstCallPattern`, first row correct on rank 0 only)."""

import os

import torch
from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer
from tests.integration.scripted_rewards import FirstCallPattern
from trl_groupx.toy import arithmetic_dataset

G, B = 4, 6
RANK = int(os.environ.get("RANK", "0"))


def solution_dataset(prefix: str = ""):
    """The toy arithmetic dataset (64 rows, seed 0) with a `solution` column: `prefix` + the answer's text."""
    base = arithmetic_dataset(64, seed=0)
    return base.add_column("solution", [prefix + a for a in base["answer"]])


def scripted_reward(rescore, name: str) -> FirstCallPattern:
    """This rank's `FirstCallPattern`: generated batches score global row 0 only; re-scoring calls use `rescore`."""
    return FirstCallPattern(rescore, name=name, first_row_correct=RANK == 0)


def rescoring_trainer(out_dir, dataset, reward, **flags):
    """One-step trainer of the layout above (rows in dataset order, completions of at most 8 tokens)."""
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run", dataset=dataset,
                         reward_funcs=reward, shuffle_dataset=False, per_device_train_batch_size=B,
                         max_completion_length=8, max_steps=1, **flags)


def first_batch(trainer) -> list[dict]:
    """This rank's first training batch, with the model in training mode and the RNG at seed 0 (as `train` draws it)."""
    trainer.model.train()
    torch.manual_seed(0)
    return next(iter(trainer.get_train_dataloader()))


def group_normalised_local(rewards: torch.Tensor) -> torch.Tensor:
    """This rank's slice of GRPO's advantages `(r − mean) / (std + 1e-4)` per group of `G`, from the global rewards."""
    grouped = rewards.view(-1, G)
    advantages = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    return advantages.flatten()[RANK * B : (RANK + 1) * B]


def num_items_ok(trainer, output: dict) -> bool:
    """`num_items_in_batch` is the loss-token count of the whole global batch (the rewritten rows included)."""
    return bool(output["num_items_in_batch"] == trainer.accelerator.gather(output["completion_mask"].sum()).sum())


def params_agree_after_training(trainer) -> bool:
    """`trainer.train()` (one real step), then whether every rank holds the same parameters (float64 checksum)."""
    trainer.train()
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    return all(s == sums[0] for s in sums)
