"""VeriGate: one real step on the tiny model with a verifier and the rule-based arithmetic PRM, full and LoRA.
The verifier is degenerate (all 0) on prompts with an even answer and mixes within groups otherwise, so one batch
has both kinds of group: the advantages are exactly VeriGate's on the trainer's per-function rewards, and the
gradient differs from plain GRPO on the verifier (which gets nothing from the degenerate groups)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.advantages.verigate import verigate_advantages
from trl_groupx.rewards import arithmetic_prefix_prm


def gated_verifier(completions, answer, **kwargs) -> list[float]:
    """0 for every completion of a prompt whose answer is even (a degenerate group), else 1 on odd rows of the
    batch (a group's rows are contiguous, so such a group mixes 0 and 1)."""
    return [0.0 if int(a) % 2 == 0 else float(i % 2) for i, a in enumerate(answer)]


def ours(tmp_path, peft=False, reward_funcs=(gated_verifier, arithmetic_prefix_prm), **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=list(reward_funcs), **flags)


def check_batch(per_func):
    verifier = per_func[:, 0].view(-1, 4)
    degenerate = verifier.amax(1) == verifier.amin(1)
    assert degenerate.any() and not degenerate.all(), verifier  # the fixture gives both kinds of group
    return degenerate


@pytest.mark.parametrize("peft", [False, True])
def test_verigate_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, reward_funcs=[gated_verifier]))
    trainer = ours(tmp_path / "vg", peft, advantage_estimator="verigate")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    per_func = trainer._rewards_per_func
    degenerate = check_batch(per_func)
    expected = verigate_advantages(per_func, 4)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    # mixed groups: GRPO's numbers on the verifier; degenerate groups: PRM advantages where GRPO has zeros
    grpo = group_normalized_advantages(per_func[:, 0], 4).view(-1, 4)
    torch.testing.assert_close(expected.view(-1, 4)[~degenerate], grpo[~degenerate])
    assert grpo[degenerate].eq(0).all() and expected.view(-1, 4)[degenerate].abs().sum() > 0
    assert grads_differ(base_grads, grads)


def test_verigate_composes_with_gmpo_and_swapped_columns(tmp_path):
    trainer = ours(tmp_path, reward_funcs=(arithmetic_prefix_prm, gated_verifier), loss_type="gmpo",
                   advantage_estimator="verigate", verigate_outcome_reward_index=1, verigate_process_reward_index=0)
    _, grads, inputs = one_step(trainer)
    per_func = trainer._rewards_per_func
    expected = verigate_advantages(per_func, 4, verigate_outcome_reward_index=1, verigate_process_reward_index=0)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_verigate_with_one_reward_function_fails_at_construction_with_the_flag_named(tmp_path):
    with pytest.raises(ValueError, match="verigate_process_reward_index=1, but the trainer was given 1 reward"):
        ours(tmp_path, reward_funcs=[gated_verifier], advantage_estimator="verigate")
