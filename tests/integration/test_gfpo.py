"""GFPO on the tiny model: one real step, full and LoRA; dropped rollouts neutralised; compositions."""

import dataclasses

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, generate_first_batch, grads_differ, one_step, parity_reward
from trl_groupx.contracts import config_kwargs
from trl_groupx.sampling.gfpo import gfpo_filter

G, K = 4, 2


def _trainer(tmp_path, peft=False, **flags):
    flags = {"loss_type": "dapo", "shuffle_dataset": False, **flags}
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _spy(trainer):
    """Record the RolloutBatch and keep mask the trainer passes through the sampling stage."""
    seen = {}
    variant = trainer.variants["sampling"]

    kwargs = config_kwargs(variant.fn, trainer.args)  # the spy has no keyword-only fields of its own

    def spy(batch, **extra):  # extra: trainer-supplied inputs (global_step, total_steps)
        seen["batch"], seen["keep"], seen["extra"] = batch, variant.fn(batch, **kwargs, **extra), extra
        return seen["keep"]

    trainer.variants["sampling"] = dataclasses.replace(variant, fn=spy)
    return seen


def _generate(trainer):
    """The generation output of the first batch, unshuffled (`generate_first_batch`)."""
    return generate_first_batch(trainer)[1]


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("metric", ["length", "reward_per_token"])
def test_gfpo_step_neutralises_dropped_rollouts(tmp_path, peft, metric):
    trainer = _trainer(tmp_path / "gfpo", peft, rollout_filter="gfpo", gfpo_keep=K, gfpo_metric=metric)
    seen = _spy(trainer)
    output = _generate(trainer)
    b, keep = seen["batch"], seen["keep"]
    assert torch.equal(keep, gfpo_filter(b, gfpo_keep=K, gfpo_metric=metric))
    assert (keep.view(-1, G).sum(1) == K).all()  # parity reward scores every rollout
    if metric == "length":  # the kept rollouts are the K shortest of their group
        lengths = b.completion_lengths.view(-1, G)
        k = keep.view(-1, G)
        assert (lengths.masked_fill(~k, -1).max(1).values <= lengths.masked_fill(k, 10**9).min(1).values).all()
    mask = output["completion_mask"]
    assert (mask[~keep] == 0).all()
    assert torch.equal(mask[keep].sum(-1), b.completion_lengths[keep].to(mask))  # kept rows untouched
    assert (output["advantages"][~keep] == 0).all()
    assert output["num_items_in_batch"] == b.completion_lengths[keep].sum()
    # kept advantages: TRL's formula over the kept set (mean, unbiased std, eps 1e-4), groups of K
    r = trainer._rewards_per_func[:, 0][keep].view(-1, K)
    expected = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(output["advantages"][keep], expected.flatten())


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_gfpo_changes_the_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(_trainer(tmp_path / "base", peft))
    _, grads, inputs = one_step(_trainer(tmp_path / "gfpo", peft, rollout_filter="gfpo", gfpo_keep=K))
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, filtered after
    assert inputs["completion_mask"].sum() < base_inputs["completion_mask"].sum()
    assert grads_differ(base_grads, grads)


def test_gfpo_composes_with_an_advantage_variant(tmp_path):
    trainer = _trainer(tmp_path, rollout_filter="gfpo", gfpo_keep=K, advantage_estimator="sign_adv")
    seen = _spy(trainer)
    output = _generate(trainer)
    keep = seen["keep"]
    r = trainer._rewards_per_func[:, 0]
    assert (output["advantages"][~keep] == 0).all()
    torch.testing.assert_close(output["advantages"][keep], 2 * r[keep] - 1)  # sign_adv on the kept rollouts
    loss, grads, _ = one_step(_trainer(tmp_path / "b", rollout_filter="gfpo", gfpo_keep=K,
                                       advantage_estimator="sign_adv"))
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())


def test_gfpo_composes_with_an_objective(tmp_path):
    _, base, _ = one_step(_trainer(tmp_path / "a", loss_type="gmpo"))
    trainer = _trainer(tmp_path / "b", rollout_filter="gfpo", gfpo_keep=K, loss_type="gmpo")
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and grads_differ(base, grads)
    dropped = inputs["completion_mask"].sum(-1) == 0
    assert dropped.sum() == inputs["completion_mask"].size(0) // G * (G - K)
    assert (inputs["advantages"][dropped] == 0).all()


def _first_group_failed(completions, **kwargs):
    """Parity reward, except that the first group of every generation batch is all-wrong (hard prompt)."""
    return [0.0 if i < G else r for i, r in enumerate(parity_reward(completions))]


def test_adaptive_gfpo_keeps_more_of_harder_groups(tmp_path):
    trainer = _trainer(tmp_path, rollout_filter="gfpo", gfpo_adaptive=True, gfpo_adaptive_keep="3,3,2,1",
                       reward_funcs=_first_group_failed)
    seen = _spy(trainer)
    output = _generate(trainer)
    keep = seen["keep"]
    p = trainer._rewards_per_func[:, 0].view(-1, G).mean(1)
    expected_k = torch.tensor([3, 3, 2, 1])[(p * 4).floor().long().clamp(0, 3)]
    assert torch.equal(keep.view(-1, G).sum(1), expected_k)
    assert expected_k[0] == 3 and expected_k[1] < 3  # the failed (hard) group keeps more than the easier one
    assert (output["completion_mask"][~keep] == 0).all() and (output["advantages"][~keep] == 0).all()
    assert output["num_items_in_batch"] == seen["batch"].completion_lengths[keep].sum()
