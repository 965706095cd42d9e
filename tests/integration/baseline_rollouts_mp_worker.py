"""Run by test_baseline_rollouts.py under `torchrun --nproc_per_node 2` (gloo, CPU): 2 processes × 2 rollouts with
G = 4, so the one group of a step is split across the processes. ReMax: both processes must train on the greedy
baseline of the group's first piece (rank 0's); AAPO (LoRA): each rollout on its own reference sample. Writes one
JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.test_baseline_rollouts import RecordingReward  # noqa: E402
from tests.integration.torchrun import finish  # noqa: E402
from trl_groupx.advantages import aapo_advantages, remax_advantages  # noqa: E402


def check(estimator: str, out_dir: Path) -> dict:
    reward = RecordingReward()
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / estimator,
                            peft=estimator == "aapo", reward_funcs=reward, per_device_train_batch_size=2,
                            num_generations=4, advantage_estimator=estimator)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0]
    advantages = trainer.accelerator.gather(output["advantages"])
    (_, _, _), (baseline_prompts, _, baseline_rewards) = reward.calls
    every_rank = gather_object([[[p[-1]["content"] for p in baseline_prompts], baseline_rewards]])
    if estimator == "remax":
        first_piece = torch.tensor(every_rank[0][1][0])  # rank 0 holds the group's first rows
        expected = remax_advantages(rewards, 4, greedy_baseline_rewards=first_piece.repeat(4))
        ok_prompts = every_rank[0][0] == every_rank[1][0] and len(every_rank[0][0]) == 1
    else:
        ref = torch.tensor([r for rank in every_rank for r in rank[1]])  # one per rollout, in process order
        expected = aapo_advantages(rewards, 4, reference_sample_rewards=ref)
        ok_prompts = all(len(rank[0]) == 2 for rank in every_rank)
    return {
        "estimator": estimator,
        "rank": trainer.accelerator.process_index,
        "matches_formula": bool(torch.allclose(advantages, expected.to(advantages), atol=1e-6)),
        "baseline_prompts_ok": bool(ok_prompts),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(estimator, out_dir)) for estimator in ("remax", "aapo")]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
