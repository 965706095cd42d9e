"""The std dial: one real step on the tiny model (full and LoRA). "divide" trains exactly like plain GRPO
(scale_rewards="group"), "none" exactly like Dr. GRPO's scale_rewards="none" and differs from plain GRPO;
composes with another stage (GMPO objective)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_std_dial_is_trl_scale_rewards(tmp_path, peft):
    _, g_grpo, in_grpo = one_step(ours(tmp_path / "grpo", peft, loss_type="grpo"))
    _, g_dr, in_dr = one_step(ours(tmp_path / "dr", peft, loss_type="grpo", scale_rewards="none"))
    _, g_none, in_none = one_step(ours(tmp_path / "none", peft, loss_type="grpo", advantage_estimator="std_dial",
                                       std_dial_mode="none"))
    _, g_div, in_div = one_step(ours(tmp_path / "div", peft, loss_type="grpo", advantage_estimator="std_dial"))
    assert torch.equal(in_none["completion_ids"], in_grpo["completion_ids"])  # same batch
    assert torch.equal(in_none["advantages"], in_dr["advantages"])
    assert torch.equal(in_div["advantages"], in_grpo["advantages"])
    for k in g_grpo:
        assert torch.equal(g_none[k], g_dr[k]) and torch.equal(g_div[k], g_grpo[k])
    assert grads_differ(g_grpo, g_none)


def test_std_dial_composes_with_gmpo(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="std_dial", std_dial_mode="none")
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
