"""PAPO: one real step on the tiny model with two reward functions, an outcome verifier (the parity reward, 0/1,
mixes within groups) and a process reward (the rule-based arithmetic PRM), full and LoRA. The advantages are
exactly PAPO's on the trainer's per-function rewards and the gradient differs from plain GRPO on the same batch."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from trl_groupx.advantages.papo import papo_advantages
from trl_groupx.rewards import arithmetic_prefix_prm

REWARDS = [parity_reward, arithmetic_prefix_prm]


def ours(tmp_path, peft=False, reward_funcs=REWARDS, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=reward_funcs, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_papo_changes_gradient_with_exact_advantages(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    trainer = ours(tmp_path / "papo", peft, advantage_estimator="papo")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    per_func = trainer._rewards_per_func
    assert per_func.shape[1] == 2
    expected = papo_advantages(per_func, 4)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    # the process term is active on this batch (else the check below would only compare reward sums)
    assert not torch.allclose(expected, papo_advantages(per_func, 4, papo_process_weight=0.0))
    assert grads_differ(base_grads, grads)


def test_papo_swapped_columns_and_gmpo_objective(tmp_path):
    trainer = ours(tmp_path, reward_funcs=REWARDS[::-1], loss_type="gmpo", advantage_estimator="papo",
                   papo_outcome_reward_index=1, papo_process_reward_index=0, papo_process_weight=0.6)
    _, grads, inputs = one_step(trainer)
    per_func = trainer._rewards_per_func
    expected = papo_advantages(per_func, 4, papo_outcome_reward_index=1, papo_process_reward_index=0,
                               papo_process_weight=0.6)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_papo_with_one_reward_function_fails_at_construction_with_the_flag_named(tmp_path):
    with pytest.raises(ValueError, match=r"advantage_estimator='papo' reads reward_funcs\[papo_process_reward_index\] "
                                         r"with papo_process_reward_index=1, but the trainer was given 1 reward"):
        ours(tmp_path, reward_funcs=[parity_reward], advantage_estimator="papo")
    with pytest.raises(ValueError, match="papo_process_reward_index=3, but the trainer was given 2 reward"):
        ours(tmp_path / "b", advantage_estimator="papo", papo_process_reward_index=3)
