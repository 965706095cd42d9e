"""Run by test_spo_tree.py under `torchrun --nproc_per_node 2` (gloo, CPU): one SPO-tree generation batch of one group
of 4 that spans both ranks (2 rows each, branching [2, 2, 1]: rank 1's slot 3 continues rank 1's slot 2, rank 0's
slot 1 continues rank 0's slot 0), and checks that both ranks hold the same gathered paths and node values and that
the paths form the tree. Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer, generate_first_batch  # noqa: E402
from tests.integration.test_spo_tree import FLAGS, M, responses  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.token_weights.spo_tree_rollouts import tree_values  # noqa: E402


def check(out_dir: Path) -> dict:
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "tree",
                            per_device_train_batch_size=2, num_generations=4, **FLAGS)
    _, output = generate_first_batch(trainer)
    paths = gather_object(responses(output))
    values = tree_values(trainer, output)[0].nan_to_num(-1).tolist()
    everyone = gather_object([[paths, values, trainer._rewards_per_func.tolist()]])
    tree = all((b[:M] == a[:M] and len(b) > M) if len(a) > M else b == a
               for a, b in ((paths[0], paths[1]), (paths[2], paths[3])))
    return {"paths": paths, "ranks_agree": all(e == everyone[0] for e in everyone), "tree_paths": tree,
            "continued": trainer._metrics["train"]["groupx/spo_tree_continued_rows"][-1]}


if __name__ == "__main__":
    run_worker(check)
