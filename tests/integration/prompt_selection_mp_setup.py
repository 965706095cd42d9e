"""Setup shared by the two-process (torchrun, gloo, CPU) workers of the prompt-selection variants (`v0_value`,
`vade`): 2 processes × 4 rollouts with G = 4, so each generation batch selects two prompts, one group per process,
for two training steps on the 8-prompt toy dataset. The reward (parity) records which prompts this rank scored; a
spy on the variant's state update records each selection and the global rewards it was given."""

import dataclasses
import inspect
from types import ModuleType
from typing import Any

from accelerate.utils import gather_object

import trl_groupx
from tests.conftest import build_trainer, parity_reward
from trl_groupx.toy import arithmetic_dataset

G = 4
STEPS = 2
DATASET = arithmetic_dataset(8, seed=0)
TEXTS = [row["prompt"][-1]["content"] for row in DATASET]  # a prompt's text -> its dataset index: TEXTS.index


@dataclasses.dataclass
class SelectionRun:
    """What one rank saw while training.

    Attributes:
        trainer: the trained trainer.
        local_prompts (`list[list[str]]`): per reward call, the prompt texts of this rank's rows.
        selections (`list[list[int]]`): per state update, the selected dataset indices (the whole batch's).
        global_rewards (`list[list[float]]`): per state update, the global rewards it was given.
    """

    trainer: Any = None
    local_prompts: list[list[str]] = dataclasses.field(default_factory=list)
    selections: list[list[int]] = dataclasses.field(default_factory=list)
    global_rewards: list[list[float]] = dataclasses.field(default_factory=list)


def train_with_selection_spy(out_dir, rollout_filter: str, module: ModuleType, update: str, **flags) -> SelectionRun:
    """Build the trainer of `rollout_filter`, replace `module.<update>` (the state update, which takes the selected
    indices as `prompts`) with a recording spy, and train `STEPS` steps."""
    run = SelectionRun()

    def reward(prompts, completions, **kwargs):
        run.local_prompts.append([p[-1]["content"] for p in prompts])
        return parity_reward(completions)

    reward.__name__ = "parity_reward"
    run.trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / rollout_filter,
                                per_device_train_batch_size=4, num_generations=G, rollout_filter=rollout_filter,
                                dataset=DATASET, max_steps=STEPS, reward_funcs=[reward], **flags)
    real_update = getattr(module, update)
    signature = inspect.signature(real_update)

    def spy(*args, **kwargs):
        run.selections.append(signature.bind(*args, **kwargs).arguments["prompts"].tolist())
        run.global_rewards.append(run.trainer._rewards_per_func[:, 0].tolist())
        return real_update(*args, **kwargs)

    setattr(module, update, spy)
    run.trainer.train()
    return run


def lockstep_checks(run: SelectionRun, state: list) -> dict:
    """This rank's result: the checks both workers make, (a) every rank selected the same prompts in the same order
    on every step, (b) this rank generated for its own slice of each selection, (c) every rank holds the same
    `state` (the variant's state as JSON-able lists)."""
    rank = run.trainer.accelerator.process_index
    mine = all(local == [TEXTS[sel[rank]]] * G for local, sel in zip(run.local_prompts, run.selections))
    all_selections = gather_object([run.selections])
    all_states = gather_object([state])
    return {
        "rank": rank,
        "selections": run.selections,
        "ranks_agree_on_selection": all(s == all_selections[0] for s in all_selections)
        and len(run.selections) == STEPS,
        "local_rows_are_my_slice": mine and len(run.local_prompts) == STEPS,
        "ranks_agree_on_state": all(s == all_states[0] for s in all_states),
    }
