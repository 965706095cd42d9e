"""Run by test_pilot_commit.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank trains two steps with
rollout_filter="pilot_commit" (2 processes × 4 rollouts, G = 4: two committed prompts per generation batch, one group
per process; 2 pilot samples per candidate, so each rank generates one candidate's pilot rows per round) under
test_pilot_commit.ScriptedReward's rule, and checks that (a) both ranks committed the same prompts and hold the same
state (the buffered prompts' pilot rollouts included), (b) each rank trained on its own slice of the committed
prompts, (c) each rank piloted its own slice of the candidates, (d) only band prompts were trained, (e) the first
two rows of each rank's group are its prompt's pilot rollouts, gathered from both ranks. Writes one JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer
from tests.integration.test_pilot_commit import MIXED, PILOT, G, ScriptedReward
from tests.integration.torchrun import finish
from trl_groupx.sampling import pilot_commit as pilot_module
from trl_groupx.sampling import pilot_commit_glue
from trl_groupx.toy import arithmetic_dataset


def last_pilots(records: list, prompt: int) -> list[list[int]]:
    """The completions of `prompt`'s latest pilot round."""
    indices, completions = next((i, c) for i, c in reversed(records) if prompt in i)
    return completions[indices.index(prompt)]


def main() -> None:
    out_dir = Path(sys.argv[1])
    data = arithmetic_dataset(8, seed=0)
    reward = ScriptedReward([row["prompt"][-1]["content"] for row in data])
    spliced, pilot_records = [], []
    reuse, pilot_rollouts = pilot_commit_glue.reuse_pilot_rollouts, pilot_commit_glue.pilot_rollouts

    def reuse_spy(trainer, inputs, output):
        output = reuse(trainer, inputs, output)
        spliced.append([output["completion_ids"][r][output["completion_mask"][r].bool()].tolist() for r in (0, 1)])
        return output

    def pilot_spy(trainer, indices, samples):
        result = pilot_rollouts(trainer, indices, samples)
        pilot_records.append((list(indices), result[2]))
        return result

    pilot_commit_glue.reuse_pilot_rollouts, pilot_commit_glue.pilot_rollouts = reuse_spy, pilot_spy
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "pilot_commit",
                            per_device_train_batch_size=4, num_generations=G, rollout_filter="pilot_commit",
                            pilot_commit_pilot_samples=PILOT, dataset=data, max_steps=2, reward_funcs=[reward])
    commits, pilots, original = [], [], pilot_module.commit_rounds

    def recording(state, pilot, *args, **kwargs):
        def spy(indices):
            pilots.append(list(indices))
            return pilot(indices)

        committed, stats = original(state, spy, *args, **kwargs)
        commits.append(committed)
        return committed, stats

    pilot_module.commit_rounds = recording
    trainer.train()
    rank = trainer.accelerator.process_index
    training = [ids for ids, _ in reward.calls if len(ids) == G]
    piloted = [ids for ids, _ in reward.calls if len(ids) == PILOT]
    state = trainer.variant_state["pilot_commit"]
    summary = [state["buffer_index"].tolist(), state["excluded"].tolist(), state["step"], state["round"],
               state["committed_rounds"].tolist(),
               {k: [t.tolist() for t in v["ids"]] for k, v in state.get("pilot_rollouts", {}).items()}]
    all_commits, all_states = gather_object([commits]), gather_object([summary])
    result = {
        "rank": rank,
        "commits": commits,
        "ranks_agree": all(c == all_commits[0] for c in all_commits) and all(s == all_states[0] for s in all_states),
        "trained_my_slice": len(training) == 2 and all(ids == [c[rank]] * G for ids, c in zip(training, commits)),
        "piloted_my_slice": len(piloted) == len(pilots)
        and all(ids == [cands[rank]] * PILOT for ids, cands in zip(piloted, pilots)),
        "band_only": all(set(c) <= MIXED for c in commits),
        "trained_my_pilots": len(spliced) == 2 and all(
            rows == last_pilots(pilot_records, c[rank])[:PILOT] for rows, c in zip(spliced, commits)),
    }
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
