"""Peer-framework advantage estimators (RLOO, REINFORCE++-baseline, pass@k) and GOPO's rank-only advantages: one
real step on the tiny model (full and LoRA) trains on exactly the formula's advantages and changes the gradient
against plain GRPO; each composes with another stage (GMPO objective) and TRL's DAPO loss."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def graded_reward(completions, **kwargs) -> list[float]:
    """Deterministic reward in [0, 1] with few ties (last character's code point mod 7, over 6)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(ord(t[-1]) % 7) / 6 if t else 0.0 for t in texts]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=graded_reward, **flags)


ESTIMATORS = ["rloo", "reinforce_pp_baseline", "grpo_passk", "gopo"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("peft", [False, True])
def test_changes_gradient_and_uses_formula(tmp_path, peft, estimator):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "v", peft, loss_type="grpo", advantage_estimator=estimator)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    variant = trl_groupx.get_variant(estimator)
    expected = trainer._call(variant, trainer._rewards_per_func[:, 0], 4)
    # TRL shuffles the rollouts after scoring: compare as multisets
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert expected.abs().sum() > 0 and torch.isfinite(inputs["advantages"]).all()
    if estimator == "grpo_passk":
        assert (inputs["advantages"] != 0).sum() <= len(expected) // 4  # at most one credited rollout per group
    if estimator == "gopo":
        assert inputs["advantages"].abs().max() <= 2  # 2 − 4(rank − 1)/(G − 1)
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("flags", [dict(loss_type="gmpo"), dict(loss_type="dapo", epsilon_high=0.28)])
def test_composes(tmp_path, flags, estimator):
    trainer = ours(tmp_path, advantage_estimator=estimator, **flags)
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())
