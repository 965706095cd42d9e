"""Run by test_igrpo.py under `torchrun --nproc_per_node 2` (gloo, CPU). Two layouts: 2 processes × 2 rows with
G = 4 and k = 3 (one group split across the processes: rank 0 samples its drafts, rank 1 pads its generation call
to the same size), and 2 × 4 rows with G = 2 and k = 2 (two whole groups per process). Every row of a group must
get the same stage-2 prompt, built from the argmax-reward draft of the process that holds the group's first row,
and the advantages must be GRPO's on the gathered stage-2 rewards. Writes one JSON line per layout per rank to the
folder given as argv[1]."""

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
from tests.integration.test_igrpo import SHORT_TEMPLATE, RecordingReward, _expected_best, _user  # noqa: E402
from tests.integration.torchrun import finish  # noqa: E402


def check(local_n: int, group_size: int, k: int, out_dir: Path) -> dict:
    reward = RecordingReward()
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / f"{local_n}x{group_size}",
                            reward_funcs=reward, per_device_train_batch_size=local_n, num_generations=group_size,
                            rollout_filter="igrpo", igrpo_num_drafts=k, igrpo_draft_template=SHORT_TEMPLATE)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    drafts, stage2 = reward.calls
    every_rank = gather_object([drafts])  # each rank's draft call, in rank order
    prompts = gather_object([_user(p) for p in stage2["prompts"]])  # global stage-2 prompts, in row order
    originals = gather_object([_user(x["prompt"]) for x in batch])
    rank = trainer.accelerator.process_index

    same_in_group = all(len(set(prompts[g:g + group_size])) == 1 for g in range(0, len(prompts), group_size))
    argmax_ok = True
    for g in range(len(prompts) // group_size):
        owner, row = divmod(g * group_size, local_n)
        slot = sum(1 for i in range(row) if (owner * local_n + i) % group_size == 0)
        rewards = every_rank[owner]["rewards"][slot * k:(slot + 1) * k]
        draft = every_rank[owner]["texts"][slot * k + _expected_best(rewards)]
        argmax_ok &= prompts[g * group_size] == originals[g * group_size] + SHORT_TEMPLATE.replace("{draft}", draft)
    owned = [sum(1 for i in range(local_n) if (p * local_n + i) % group_size == 0) * k for p in range(2)]

    r = trainer._rewards_per_func[:, 0].view(-1, group_size)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    advantages = trainer.accelerator.gather(output["advantages"])
    return {
        "layout": f"{local_n}x{group_size}",
        "rank": rank,
        "one_stage_two_prompt_per_group": bool(same_in_group),
        "argmax_of_the_owners_drafts": bool(argmax_ok),
        "drafts_per_rank": [len(d["prompts"]) for d in every_rank],
        "expected_drafts_per_rank": [max(owned)] * 2,
        "matches_grpo": bool(torch.allclose(advantages, expected.to(advantages), atol=1e-5)),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(local_n, g, k, out_dir)) for local_n, g, k in ((2, 4, 3), (4, 2, 2))]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
