"""2-GRPO: one real step with G = 2 on the tiny model (full and LoRA).

2-GRPO *is* GRPO at G = 2, so against plain GRPO on the same batch (num_generations=2) the gradient is the same bit
for bit — the test asserts that identity rather than a difference — and it differs from the default 4-GRPO step.
Pairs get equal and opposite advantages ±0.5/(√0.5 + 1e-4) or 0; composes with another stage (GMPO objective)."""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step

M = 0.5 / (math.sqrt(0.5) + 1e-4)


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_two_grpo_is_grpo_with_pairs(tmp_path, peft):
    _, g_grpo2, in_grpo2 = one_step(ours(tmp_path / "g2", peft, loss_type="grpo", num_generations=2))
    trainer = ours(tmp_path / "two", peft, loss_type="grpo", advantage_estimator="two_grpo", num_generations=2)
    _, g_two, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], in_grpo2["completion_ids"])
    assert torch.equal(inputs["advantages"], in_grpo2["advantages"])
    for k in g_grpo2:
        assert torch.equal(g_two[k], g_grpo2[k])
    adv = inputs["advantages"]
    assert all(any(abs(a - v) < 1e-6 for v in (0.0, M, -M)) for a in adv.tolist())
    rewards = trainer._rewards_per_func[:, 0].view(-1, 2)
    assert (rewards[:, 0] != rewards[:, 1]).sum() * 2 == (adv != 0).sum()  # every mixed pair gets ±M
    assert abs(adv.sum().item()) < 1e-5 and (adv != 0).any()
    _, g_grpo4, _ = one_step(ours(tmp_path / "g4", peft, loss_type="grpo"))
    assert grads_differ(g_grpo4, g_two)


def test_two_grpo_composes_with_gmpo(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="two_grpo", num_generations=2)
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
