"""Run by test_gcpo_ref_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 × 6 rollouts in groups of 4, so
group 1 (global rows 4-7) spans both processes. Group 0 is mixed; groups 1 and 2 fail entirely, so their last rows
(global 7 and 11) both belong to rank 1, and rank 0 joins the re-scoring call with filler rows only. Writes one JSON
line per rank to the folder given as argv[1]."""

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
from trl_groupx.toy import arithmetic_dataset

G, B = 4, 6
RANK = int(os.environ.get("RANK", "0"))
_BASE = arithmetic_dataset(64, seed=0)
DATASET = _BASE.add_column("solution", list(_BASE["answer"]))
CALLS: list[list[str]] = []


def _text(c):
    return c[-1]["content"] if isinstance(c, list) else c


def pattern_then_exact(completions, solution, **kwargs):
    """Generation calls (odd): global row 0 scores 1, every other row 0. Re-scoring calls: exact match."""
    CALLS.append([_text(c) for c in completions])
    if len(CALLS) % 2 == 1:
        return [float(RANK == 0 and i == 0) for i in range(len(completions))]
    return [float(_text(c) == s) for c, s in zip(completions, solution)]


def main() -> None:
    out_dir = Path(sys.argv[1])
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "run", dataset=DATASET,
                            reward_funcs=pattern_then_exact, rollout_filter="gcpo_ref", shuffle_dataset=False,
                            per_device_train_batch_size=B, max_completion_length=8, max_steps=1)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0]
    expected_adv = rewards.view(-1, G)
    expected_adv = ((expected_adv - expected_adv.mean(1, keepdim=True))
                    / (expected_adv.std(1, keepdim=True) + 1e-4)).flatten()[RANK * B : (RANK + 1) * B]
    tok = trainer.processing_class
    injected_local = [1, 5] if RANK == 1 else []
    refs_ok = all(
        output["completion_ids"][r, : len(ids)].tolist() == ids
        for r in injected_local
        for ids in [tok(batch[r]["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    )
    result = {
        "rank": RANK,
        "rescore_sizes": [len(c) for c in CALLS[1::2]],
        "global_rewards": rewards.tolist(),
        "injected_groups": list(trainer._metrics["train"]["groupx/reference_injected_groups"]),
        "refs_ok": refs_ok,
        "advantages_match": bool(torch.allclose(output["advantages"], expected_adv)),
        "num_items_ok": bool(output["num_items_in_batch"]
                             == trainer.accelerator.gather(output["completion_mask"].sum()).sum()),
    }
    CALLS.clear()
    trainer.train()  # one real step with the injection on both ranks
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    sums = gather_object([checksum])
    result["params_agree"] = all(s == sums[0] for s in sums)
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
