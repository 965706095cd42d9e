"""Run by test_rc_grpo.py under `torchrun --nproc_per_node 2` (gloo, CPU). Two layouts: 2 processes × 2 rows with
G = 4 (one group split across the processes) and 2 × 3 rows with G = 2 (the middle group straddles the processes;
an odd G never straddles two equal slices).
Each rank conditions its rows without any communication; the gathered rows must hold each group's tokens in the
configured counts and equal the seeded draw over the whole batch. Writes one JSON line per layout per rank to the
folder given as argv[1]."""

import json
import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

from tests.integration.test_rc_grpo import TOKENS, RecordingReward, rctp_trainer  # noqa: E402
from tests.integration.torchrun import finish  # noqa: E402
from trl_groupx.sampling.rc_grpo import row_conditions  # noqa: E402


def check(local_n: int, group_size: int, out_dir: Path) -> dict:
    reward = RecordingReward()
    trainer = rctp_trainer(out_dir / f"{local_n}x{group_size}", reward=reward, rollout_filter="rc_grpo",
                           per_device_train_batch_size=local_n, num_generations=group_size)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    conditions = gather_object(list(reward.calls[0]["conditions"]))  # each rank scores its own rows: row order
    ids = torch.tensor(trainer.processing_class.convert_tokens_to_ids(TOKENS))
    per_row = (torch.isin(output["prompt_ids"], ids) & output["prompt_mask"].bool()).sum(1)
    groups = [conditions[g:g + group_size] for g in range(0, len(conditions), group_size)]
    seeded = [TOKENS[k] for k in row_conditions([0.5, 0.5], group_size, 0, len(conditions), seed=0, step=0)]
    return {
        "layout": f"{local_n}x{group_size}",
        "rank": trainer.accelerator.process_index,
        "counts_per_group": [sorted(Counter(g).values()) for g in groups],
        "expected_counts": [[group_size // 2, -(-group_size // 2)] for _ in groups],
        "rows_match_the_seeded_draw": conditions == seeded,
        "one_token_per_prompt": bool(trainer.accelerator.gather(per_row).eq(1).all()),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(local_n, g, out_dir)) for local_n, g in ((2, 4), (3, 2))]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
