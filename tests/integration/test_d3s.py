"""D³S sample level on the tiny model: one real step, full and LoRA; dropped rollouts neutralised; compositions."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.test_gfpo import _generate, _spy, _trainer
from trl_groupx.sampling.d3s import d3s_filter

G = 4


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_d3s_step_neutralises_dropped_rollouts(tmp_path, peft):
    trainer = _trainer(tmp_path, peft, rollout_filter="d3s", d3s_keep_start=0.5, d3s_keep_end=1.0)
    seen = _spy(trainer)
    output = _generate(trainer)
    b, keep = seen["batch"], seen["keep"]
    assert seen["extra"] == {"global_step": 0, "total_steps": trainer.state.max_steps}
    assert torch.equal(keep, d3s_filter(b, d3s_keep_start=0.5, d3s_keep_end=1.0, **seen["extra"]))
    k = 2  # step 0: round(0.5 · 4)
    assert (keep.view(-1, G).sum(1) == k).all()
    r = trainer._rewards_per_func[:, 0]
    # max-variance pair: a mixed group keeps one correct and one wrong rollout
    mixed = r.view(-1, G).std(1) > 0
    assert (r[keep].view(-1, k).std(1)[mixed] > 0).all()
    mask = output["completion_mask"]
    assert (mask[~keep] == 0).all() and (output["advantages"][~keep] == 0).all()
    assert torch.equal(mask[keep].sum(-1), b.completion_lengths[keep].to(mask))
    assert output["num_items_in_batch"] == b.completion_lengths[keep].sum()
    rk = r[keep].view(-1, k)
    expected = (rk - rk.mean(1, keepdim=True)) / (rk.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(output["advantages"][keep], expected.flatten())


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_d3s_changes_the_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(_trainer(tmp_path / "base", peft))
    _, grads, inputs = one_step(_trainer(tmp_path / "d3s", peft, rollout_filter="d3s"))
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    assert inputs["completion_mask"].sum() < base_inputs["completion_mask"].sum()
    assert grads_differ(base_grads, grads)


def test_d3s_composes_with_an_advantage_variant_and_an_objective(tmp_path):
    trainer = _trainer(tmp_path / "a", rollout_filter="d3s", advantage_estimator="sign_adv")
    seen = _spy(trainer)
    output = _generate(trainer)
    keep, r = seen["keep"], trainer._rewards_per_func[:, 0]
    assert (output["advantages"][~keep] == 0).all()
    torch.testing.assert_close(output["advantages"][keep], 2 * r[keep] - 1)
    _, base, _ = one_step(_trainer(tmp_path / "b", loss_type="gmpo"))
    loss, grads, inputs = one_step(_trainer(tmp_path / "c", rollout_filter="d3s", loss_type="gmpo"))
    assert torch.isfinite(loss) and grads_differ(base, grads)
    dropped = inputs["completion_mask"].sum(-1) == 0
    assert dropped.sum() == inputs["completion_mask"].size(0) // 2 and (inputs["advantages"][dropped] == 0).all()


def test_d3s_sample_and_token_levels_compose(tmp_path):
    # the full D³S: sample-level filter + token-level mask (d3s_token); dropped rollouts stay at advantage 0
    trainer = _trainer(tmp_path, rollout_filter="d3s", token_weighting="d3s_token")
    loss, grads, inputs = one_step(trainer)
    dropped = inputs["completion_mask"].sum(-1) == 0
    assert dropped.sum() == inputs["completion_mask"].size(0) // 2
    assert inputs["advantages"].dim() == 2 and (inputs["advantages"][dropped] == 0).all()
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
