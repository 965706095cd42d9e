"""Objectives that declare `requires=("group_structure",)` get each row's prompt-group id, and it survives TRL's
shuffle and micro-batch split: rows with one id share one prompt and every id appears group-size times."""

import torch

from tests.integration.objective_helpers import ours
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import clipped_surrogate
from trl_groupx.registry import register, scoped_variants

SEEN = []


def test_group_ids_travel_with_their_rows(tmp_path):
    with scoped_variants():

        @register("probe_groups", name="probe", paper="https://example.org", official_code=None, stage="objective",
                  flags={"loss_type": "probe_groups"}, requires=("group_structure",))
        def probe(ctx: ObjectiveContext, *, epsilon: float) -> torch.Tensor:
            """Test objective: records the group ids it receives and returns GRPO's clipped surrogate, so that the
            training step is an ordinary one."""
            SEEN.append(ctx.group_ids.clone())
            return clipped_surrogate(ctx, epsilon=epsilon, epsilon_high=None, delta=None,
                                     importance_sampling_level="token")

        trainer = ours(tmp_path, loss_type="probe_groups", per_device_train_batch_size=4,
                       gradient_accumulation_steps=2, num_generations=4)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 2
        torch.manual_seed(0)
        batch = next(iter(trainer.get_train_dataloader()))
        torch.manual_seed(0)
        micro = []
        for step in (0, 1):
            trainer._step = step
            micro.append(trainer._prepare_inputs(batch))
        for inputs in micro:
            trainer.compute_loss(trainer.model, inputs)
    ids = torch.cat(SEEN)
    prompts = torch.cat([m["prompt_ids"] for m in micro])
    assert sorted(ids.tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    for gid in (0, 1):
        rows = prompts[ids == gid]
        assert (rows == rows[0]).all()  # one prompt per group id
    assert not torch.equal(prompts[ids == 0][0], prompts[ids == 1][0])
