"""Run by test_sage.py under `torchrun --nproc_per_node 2` (gloo, CPU). Two layouts: 2 processes × 2 rows with G = 4
(one group split across the processes: rank 0 writes its hint, rank 1 pads its generation call to the same size)
and 2 × 4 rows with G = 2 (two whole groups per process). The first rollout solves nothing, the level-1 re-roll
solves every group. Every row of a group must be generated from one hinted prompt, carrying the hint of the
group's reply in the gathered order (the same on both ranks), reward functions must see the prompts without the
hint, and the advantages must be GRPO's on the gathered re-roll rewards. Writes one JSON line per layout per rank
to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
import trl_groupx.sampling.self_hints as self_hints  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.test_sage import SHORT, ScriptedReward, TaggedLevels, _user  # noqa: E402
from tests.integration.torchrun import finish  # noqa: E402


def check(local_n: int, group_size: int, out_dir: Path) -> dict:
    parser = TaggedLevels()
    self_hints.parse_hint_levels = parser
    reward = ScriptedReward(zero_calls=1, alternate=True)
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / f"{local_n}x{group_size}",
                            reward_funcs=reward, per_device_train_batch_size=local_n, num_generations=group_size,
                            rollout_filter="sage", **SHORT)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    tokenizer = trainer.processing_class
    prompts = gather_object([tokenizer.decode(p[m.bool()]) for p, m in zip(output["prompt_ids"],
                                                                           output["prompt_mask"])])
    originals = gather_object([_user(x["prompt"]) for x in batch])
    every_rank_replies = gather_object([parser.replies])
    groups = len(prompts) // group_size
    hinted_ok = all(len(set(prompts[g * group_size:(g + 1) * group_size])) == 1 for g in range(groups))
    same_ok = every_rank_replies[0] == every_rank_replies[1] and len(parser.replies) == groups
    for g in range(groups):
        text = originals[g * group_size] + " Hint:1" + parser.replies[g][:2]
        same_ok &= text in prompts[g * group_size]
    seen = gather_object([_user(p) for call in reward.calls for p in call["prompts"]])
    r = trainer._rewards_per_func[:, 0].view(-1, group_size)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    advantages = trainer.accelerator.gather(output["advantages"])
    return {
        "layout": f"{local_n}x{group_size}",
        "rank": trainer.accelerator.process_index,
        "one_hinted_prompt_per_group": bool(hinted_ok),
        "same_hints_on_both_ranks": bool(same_ok),
        "rewards_see_x": all("Hint:" not in p for p in seen) and len(reward.calls) == 2,
        "matches_grpo": bool(torch.allclose(advantages, expected.to(advantages), atol=1e-5)),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(local_n, g, out_dir)) for local_n, g in ((2, 4), (4, 2))]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
