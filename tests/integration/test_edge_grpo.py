"""EDGE-GRPO EDA on the tiny model: one real step, full and LoRA; advantages rescaled by relative entropy."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_edge_grpo_rescales_by_entropy_and_changes_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "edge", peft, loss_type="grpo", token_weighting="edge_grpo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same order
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == inputs["completion_ids"].shape and (adv[mask == 0] == 0).all()
    # exact check: A' = A · P̄_g / P_i, with P from the rollout policy (weights unchanged by one_step). Groups were
    # shuffled with the batch, so recover them from the prompt ids.
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], mask], 1)
    with torch.no_grad():
        _, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, inputs["completion_ids"].size(1), compute_entropy=True
        )
    p = (ent * mask).sum(1) / mask.sum(1).clamp(min=1)
    prompts = [tuple(r[m.bool()].tolist()) for r, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
    base_adv = base_inputs["advantages"]
    for i in range(len(prompts)):
        if mask[i].sum() == 0:
            continue
        members = [j for j in range(len(prompts)) if prompts[j] == prompts[i] and mask[j].sum() > 0]
        expected = base_adv[i] * p[members].mean() / p[i].clamp(min=1e-6)
        torch.testing.assert_close(adv[i][mask[i].bool()], expected.expand(int(mask[i].sum())), atol=1e-4, rtol=1e-4)
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("loss_type", ["cispo", "gmpo"])
def test_edge_grpo_composes_with_other_objectives(tmp_path, loss_type):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type=loss_type))
    trainer = ours(tmp_path / "edge", loss_type=loss_type, token_weighting="edge_grpo")
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
