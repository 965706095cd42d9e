"""MC-GRPO on the tiny model: advantages are r − median over groups of G+1 = 3, the pivot rollout gets no loss
tokens (and no share of DAPO's token normaliser), and the gradient differs from GRPO's; full and LoRA."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import ours

FLAGS = dict(advantage_estimator="mc_grpo", num_generations=3, per_device_train_batch_size=9, mc_grpo_scale="none")


@pytest.mark.parametrize("peft", [False, True])
def test_median_baseline_and_pivot_excluded(tmp_path, peft):
    trainer = ours(tmp_path / "mc", peft, loss_type="dapo", **FLAGS)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    output = trainer._generate_and_score_completions(batch)  # rows in group order
    rewards = trainer._rewards_per_func[:, 0].view(-1, 3)
    median = rewards.median(dim=1, keepdim=True).values
    expected = (rewards - median).reshape(-1)
    torch.testing.assert_close(output["advantages"], expected)
    tokens = output["completion_mask"].sum(-1)
    pivot = (rewards == median).float().argmax(dim=1) + torch.arange(0, rewards.numel(), 3)
    assert (tokens[pivot] == 0).all()  # the pivot of each group has no loss tokens
    others = torch.ones_like(tokens, dtype=torch.bool)
    others[pivot] = False
    assert (tokens[others] > 0).all()
    assert output["num_items_in_batch"] == tokens.sum()  # DAPO's normaliser counts the G kept rollouts only


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_grpo(tmp_path, peft):
    _, g_grpo, _ = one_step(ours(tmp_path / "a", peft, loss_type="dapo", num_generations=3,
                                 per_device_train_batch_size=9))
    _, g_mc, inputs = one_step(ours(tmp_path / "b", peft, loss_type="dapo", **FLAGS))
    assert (inputs["completion_mask"].sum(-1) == 0).sum() >= 1
    assert grads_differ(g_grpo, g_mc)
