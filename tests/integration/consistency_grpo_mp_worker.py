"""Run by test_consistency_grpo.py under `torchrun --nproc_per_node 2` (gloo, CPU). Two layouts: 2 processes × 2
rows with G = 4 (each group split in halves across the processes: rank 1 holds rollouts 2 and 3) and 2 × 3 rows with
G = 2 and the first two phrasings (the middle group straddles the processes). Each rank rewrites its rows from their global indices, without
communication; the gathered rows must be exactly what one process assigns over the whole batch, every group's
prompts its row's variants in order, the paraphrase ids the global groups, and the advantages GRPO's over the
gathered groups. Writes one JSON line per layout per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

from tests.integration.test_consistency_grpo import (  # noqa: E402
    FLAGS,
    RecordingReward,
    paraphrase_dataset,
    trainer_for,
)
from tests.integration.torchrun import finish  # noqa: E402
from trl_groupx.sampling.consistency_grpo import assign_paraphrases  # noqa: E402


def check(local_n: int, group_size: int, out_dir: Path) -> dict:
    reward = RecordingReward()
    data = paraphrase_dataset().map(lambda r: {"paraphrases": r["paraphrases"][:group_size]})  # V = G
    trainer = trainer_for(out_dir / f"{local_n}x{group_size}", reward=reward, dataset=data,
                          per_device_train_batch_size=local_n, num_generations=group_size, **FLAGS)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    (call,) = reward.calls  # each rank scores its own rows: gathered in row order
    prompts, ids = gather_object(list(call["prompts"])), gather_object(list(call["ids"]))
    rewards = torch.tensor(gather_object(list(call["rewards"])))
    original = gather_object(list(batch))
    whole = assign_paraphrases(original, 0, group_size)  # what one process holding every row assigns
    r = rewards.view(-1, group_size)
    grpo = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    advantages = trainer.accelerator.gather(output["advantages"]).cpu()
    group_prompts = [[p[-1]["content"] for p in prompts[g:g + group_size]] for g in range(0, len(prompts), group_size)]
    expected = [[v[-1]["content"] for v in original[g]["paraphrases"][:group_size]]
                for g in range(0, len(original), group_size)]
    return {
        "layout": f"{local_n}x{group_size}",
        "rank": trainer.accelerator.process_index,
        "rows_match_one_process": prompts == [row["prompt"] for row in whole],
        "ids_are_global_groups": ids == [row // group_size for row in range(len(prompts))],
        "advantages_are_grpo": bool(torch.allclose(advantages, grpo, atol=1e-5)),
        "group_prompts": group_prompts,
        "expected_group_prompts": expected,
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(local_n, g, out_dir)) for local_n, g in ((2, 4), (3, 2))]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
