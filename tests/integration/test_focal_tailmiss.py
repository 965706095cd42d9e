"""F-GRPO focal scaling: one real step on the tiny model, full and LoRA, with the GRPO, DAPO and CISPO losses.

γ = 0 trains on TRL's own advantages bit for bit; γ = 0.5 trains on Â·(1 − p̂)^0.5 and changes the gradient
against the same loss without the scaling; it composes with a dispatched objective (GMPO)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages import focal_tailmiss_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def test_gamma_zero_gives_trl_advantages_bit_exactly(tmp_path):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", loss_type="grpo"))
    _, grads, inputs = one_step(ours(tmp_path / "f0", loss_type="grpo", advantage_estimator="focal_tailmiss",
                                     focal_tailmiss_gamma=0.0))
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same order
    assert torch.equal(inputs["advantages"], base_inputs["advantages"])
    for k in base_grads:
        assert torch.equal(grads[k], base_grads[k])


@pytest.mark.parametrize("loss_type, peft", [("grpo", False), ("grpo", True), ("dapo", False), ("cispo", False),
                                             ("cispo", True)])
def test_focal_changes_gradient_for_each_loss(tmp_path, loss_type, peft):
    extra = dict(epsilon_high=0.28) if loss_type == "cispo" else {}
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type=loss_type, **extra))
    trainer = ours(tmp_path / "focal", peft, loss_type=loss_type, advantage_estimator="focal_tailmiss", **extra)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    rewards = trainer._rewards_per_func[:, 0]
    expected = focal_tailmiss_advantages(rewards, 4, focal_tailmiss_gamma=0.5)
    # TRL shuffles rollouts after scoring, identically in both runs: compare as multisets, and row-wise the
    # focal advantages are the base ones times a weight in (0, 1].
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    base, adv = base_inputs["advantages"], inputs["advantages"]
    assert ((adv.abs() <= base.abs() + 1e-6) & (adv * base >= 0)).all()
    assert (adv.abs() < base.abs() - 1e-6).any()  # some mixed group was down-weighted
    assert grads_differ(base_grads, grads)


def test_focal_composes_with_gmpo(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="focal_tailmiss", focal_tailmiss_gamma=1.0)
    loss, grads, inputs = one_step(trainer)
    expected = focal_tailmiss_advantages(trainer._rewards_per_func[:, 0], 4, focal_tailmiss_gamma=1.0)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
