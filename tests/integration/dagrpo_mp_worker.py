"""Run by test_dagrpo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 12 rollouts in groups of 4 over two
ranks of 6, so group 1 (global rows 4..7) straddles them. Rank r scores groups g with g mod 2 = r only, on the global
completions, and both ranks train on advantages masked with every group's similarities. Writes one JSON line per
rank to the folder given as argv[1]."""

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
from tests.integration.torchrun import finish  # noqa: E402
from trl_groupx.advantages.dagrpo import register_dagrpo_scorer  # noqa: E402

G, LOCAL = 4, 6
SEEN: list[list[list[int]]] = []  # the completion ids of each group this rank scored


def row_parity_verifier(completions, **kwargs) -> list[float]:
    """1 on odd global rows: every group is [0, 1, 0, 1]."""
    start = int(os.environ.get("RANK", "0")) * LOCAL
    return [float((start + i) % 2) for i in range(len(completions))]


def first_pair_scorer(completions, completion_ids, **kwargs):
    """Similarity 1 between a group's first two completions, 0 elsewhere off the diagonal."""
    SEEN.append([list(c) for c in completion_ids])
    sim = [[float(i == j) for j in range(G)] for i in range(G)]
    sim[0][1] = sim[1][0] = 1.0
    return sim


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    register_dagrpo_scorer("mp_first_pair", first_pair_scorer)
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "dagrpo",
                            reward_funcs=[row_parity_verifier], per_device_train_batch_size=LOCAL, num_generations=G,
                            advantage_estimator="dagrpo", dagrpo_scorer="mp_first_pair")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(batch)
    loss = trainer.compute_loss(trainer.model, inputs)
    # every rank's completion ids (unpadded), global order: the groups each rank's scorer must have seen
    mask = inputs["completion_mask"].bool()
    a = 0.5 / (3 ** -0.5 + 1e-4)  # [0, 1, 0, 1]: A = ±0.5/(sqrt(1/3)+1e-4); rows 0, 1 of each group masked
    expected = torch.tensor([0.0, 0.0, -a, a] * 3)[rank * LOCAL:(rank + 1) * LOCAL]
    seen = gather_object([(rank, SEEN)])
    groups_by_rank = {r: len(s) for r, s in seen}
    result = {
        "rank": rank,
        "groups_split_by_rank": groups_by_rank == {0: 2, 1: 1},  # groups 0, 2 on rank 0; group 1 on rank 1
        "group_size_seen": all(len(group) == G for _, s in seen for group in s),
        "advantages": bool(torch.allclose(inputs["advantages"].sort().values.cpu(), expected.sort().values,
                                          atol=1e-5)),
        "masked_rows_no_tokens": int((mask.sum(-1) == 0).sum()) == int((expected == 0).sum()),
        "finite_loss": bool(torch.isfinite(loss)),
    }
    (out_dir / f"rank{rank}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
