"""Run by test_lspo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 × 6 rollouts in groups of 4, so group 1
(global rows 4-7) spans both processes. Group 0 is mixed; groups 1 and 2 are cliffs: rank 0 re-rolls 2 slots (global
4, 5), rank 1 re-rolls 6 (global 6-11), and both make one generate call of 6. Writes one JSON file per rank to the
folder given as argv[1]."""

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
from trl_groupx.sampling import lspo_scaffold
from trl_groupx.toy import arithmetic_dataset

G, B = 4, 6
RANK = int(os.environ.get("RANK", "0"))
_BASE = arithmetic_dataset(64, seed=0)
DATASET = _BASE.add_column("solution", list(_BASE["answer"]))
CALLS: list[int] = []
SFT: list[tuple[list, list, list[float]]] = []


def scripted(completions, **kwargs):
    """Generation calls (odd): global row 0 scores 1, every other row 0. Re-roll scoring calls: every row 1."""
    CALLS.append(len(completions))
    if len(CALLS) % 2 == 1:
        return [float(RANK == 0 and i == 0) for i in range(len(completions))]
    return [1.0] * len(completions)


def main() -> None:
    out_dir = Path(sys.argv[1])
    fit = lspo_scaffold.fit_scaffold

    def spy(trainer, model, prompts, targets):
        losses = fit(trainer, model, prompts, targets)
        SFT.append((prompts, targets, losses))
        return losses

    lspo_scaffold.fit_scaffold = spy
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run", dataset=DATASET,
                            reward_funcs=scripted, rollout_filter="lspo", shuffle_dataset=False,
                            per_device_train_batch_size=B, max_completion_length=8, max_steps=1,
                            lspo_sft_learning_rate=1e-3)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0]
    expected_adv = rewards.view(-1, G)
    expected_adv = ((expected_adv - expected_adv.mean(1, keepdim=True))
                    / (expected_adv.std(1, keepdim=True) + 1e-4)).flatten()[RANK * B : (RANK + 1) * B]
    prompts, targets, losses = SFT[0]
    result = {
        "rank": RANK,
        "reroll_scoring_sizes": CALLS[1::2],
        "global_rewards": rewards.tolist(),
        "sft_pairs": len(prompts),
        "sft": gather_object([(json.dumps(prompts), targets, losses)]),
        "advantages_match": bool(torch.allclose(output["advantages"], expected_adv)),
        "num_items_ok": bool(output["num_items_in_batch"]
                             == trainer.accelerator.gather(output["completion_mask"].sum()).sum()),
    }
    CALLS.clear()
    trainer.train()  # one real step with the scaffold on both ranks
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    result["params_agree"] = all(s == sums[0] for s in sums)
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
