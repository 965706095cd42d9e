"""Run by test_sgpo.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="sgpo" (2 processes × 4 rollouts, G = 4: 8 rows per generation batch). argv[2] is the group size rule.

Both rules check that (a) both ranks hold the same p̂ and curriculum and (b) each rank trained on its own slice of
each curriculum batch. `fixed` (two prompts per batch, one group per process) also checks that each rank profiled
its own shard (one prompt per round: rank r prompts r, r + 2, r + 4, r + 6) and the scripted p̂ and curriculum of
test_sgpo.py. `inverse_success` (cap 3: group sizes 2, 2, 2, 3, 3 along the curriculum 2, 7, 4, 1, 3) gives batch 2
the groups 3 (3 rows), 2 (2 rows), 7 (2 + the one row left = 3): global rows 3 3 3 2 | 2 7 7 7, so prompt 2's group
straddles the processes. Training rewards are the row's position, offset by 10 on rank 1 (0 1 2 3 | 10 11 12 13),
and both ranks must log GRPO's advantages of those groups, computed by hand below.
Writes one JSON line per rank to the folder given as argv[1]."""

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer
from tests.integration.test_sgpo import CURRICULUM, SUCCESSES, ScriptedReward
from tests.integration.torchrun import finish
from trl_groupx.toy import arithmetic_dataset

G = 4
PROFILING_CALLS = 4  # 8 prompts, one per rank per round


class PositionReward(ScriptedReward):
    """Scripted success counts while profiling; afterwards the row's position in this rank's call, + 10 on rank 1."""

    def __call__(self, prompts, completions, **kwargs):
        scripted = super().__call__(prompts, completions, **kwargs)
        if len(self.calls) <= PROFILING_CALLS:
            return scripted
        return [float(10 * int(os.environ["RANK"]) + k) for k in range(len(prompts))]


def _grpo(groups):
    """GRPO's advantages of each group (unbiased std + 1e-4), by hand."""
    out = []
    for g in groups:
        mean = sum(g) / len(g)
        std = math.sqrt(sum((r - mean) ** 2 for r in g) / (len(g) - 1))
        out += [(r - mean) / (std + 1e-4) for r in g]
    return out


def main() -> None:
    out_dir, rule = Path(sys.argv[1]), sys.argv[2]
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    reward = ScriptedReward(texts) if rule == "fixed" else PositionReward(texts)
    flags = {"sgpo_max_group_size": 3} if rule == "inverse_success" else {}
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "sgpo",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="sgpo",
                            sgpo_unsolvable_keep=0.5, sgpo_group_size=rule, dataset=data, max_steps=2,
                            reward_funcs=[reward], **flags)
    trainer.train()
    rank = trainer.accelerator.process_index
    state = trainer.variant_state["sgpo"]
    everyone = gather_object([[state["p_hat"].tolist(), state["order"].tolist(), state["served"]]])
    result = {"rank": rank, "calls": reward.calls,
              "ranks_agree": all(s == everyone[0] for s in everyone) and len(everyone) == 2}
    if rule == "fixed":
        result.update({
            "p_hat_is_scripted": state["p_hat"].tolist() == [s / 4 for s in SUCCESSES],
            "order_is_curriculum": state["order"].tolist() == CURRICULUM and state["served"] == 4,
            "profiled_own_shard": reward.calls[:4] == [[2 * k + rank] * G for k in range(4)],
            "trained_own_slice": reward.calls[4:] == [[CURRICULUM[2 * b + rank]] * G for b in range(2)],
        })
    else:
        batches = [[2, 2, 7, 7, 4, 4, 1, 1], [3, 3, 3, 2, 2, 7, 7, 7]]
        logged = list(trainer._logs["advantages"])[-8:]
        expected = _grpo([[0.0, 1.0, 2.0], [3.0, 10.0], [11.0, 12.0, 13.0]])
        result.update({
            "trained_own_slice": reward.calls[4:] == [b[4 * rank : 4 * rank + 4] for b in batches]
            and state["served"] == 7,
            "advantages_by_hand": len(logged) == 8 and all(abs(a - b) < 1e-5 for a, b in zip(logged, expected)),
            "logged": logged,
        })
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
