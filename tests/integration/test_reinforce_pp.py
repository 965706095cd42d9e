"""REINFORCE++ (no baseline): one real step on the tiny model (full and LoRA) trains on exactly the token-weighted
batch-whitened rewards, computed here from the completion lengths of the generated batch, and changes the gradient
against plain GRPO; it composes with another stage (GMPO objective)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_opo import capture_lengths
from tests.integration.test_peer_advantages import graded_reward


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=graded_reward, **flags)


def expected_rpp(rewards, lengths):
    """By hand: token-weighted mean and unbiased (token-count) variance over the batch, A = (r − μ)/sqrt(σ² + 1e-8)."""
    r, w = rewards.double(), lengths.double()
    t = w.sum()
    mu = (w * r).sum() / t
    var = (w * (r - mu) ** 2).sum() / (t - 1)
    return ((r - mu) / torch.sqrt(var + 1e-8)).float()


def check(trainer, inputs, seen):
    (lengths,) = seen
    expected = expected_rpp(trainer._rewards_per_func[:, 0], lengths)
    # TRL shuffles rows: compare (length, A) multisets
    got = sorted(zip(inputs["completion_mask"].sum(-1).tolist(), inputs["advantages"].tolist()))
    want = sorted(zip(lengths.tolist(), expected.tolist()))
    assert [n for n, _ in got] == [n for n, _ in want]
    torch.testing.assert_close(torch.tensor([a for _, a in got]), torch.tensor([a for _, a in want]))
    assert expected.abs().sum() > 0 and torch.isfinite(inputs["advantages"]).all()


@pytest.mark.parametrize("peft", [False, True])
def test_changes_gradient_and_uses_token_whitening(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "v", peft, loss_type="grpo", advantage_estimator="reinforce_pp")
    seen = capture_lengths(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    check(trainer, inputs, seen)
    assert grads_differ(base_grads, grads)


def test_composes_with_gmpo(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="reinforce_pp")
    seen = capture_lengths(trainer)
    loss, grads, inputs = one_step(trainer)
    check(trainer, inputs, seen)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
