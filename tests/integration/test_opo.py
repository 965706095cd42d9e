"""OPO (length-weighted optimal baseline): one real step on the tiny model (full and LoRA) trains on exactly
`r − Σ L r / Σ L` per group, computed here from the completion lengths of the generated batch, and changes the
gradient against plain GRPO; it composes with another stage (GMPO objective) and TRL's DAPO loss."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_peer_advantages import graded_reward


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=graded_reward, **flags)


def capture_lengths(trainer):
    """Record the completion lengths of each generation batch in rollout order (before TRL shuffles it)."""
    seen = []
    original = trainer.apply_rollout_stages

    def wrapped(output):
        seen.append(output["completion_mask"].sum(-1).clone())
        return original(output)

    trainer.apply_rollout_stages = wrapped
    return seen


def expected_opo(rewards, lengths, g=4):
    """OPO by hand, one group at a time: b = Σ L·r / Σ L, A = r − b."""
    out = torch.empty_like(rewards)
    for s in range(0, len(rewards), g):
        r, ln = rewards[s:s + g], lengths[s:s + g].to(rewards)
        out[s:s + g] = r - (ln * r).sum() / ln.sum()
    return out


@pytest.mark.parametrize("peft", [False, True])
def test_changes_gradient_and_uses_length_weighted_baseline(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "v", peft, loss_type="grpo", advantage_estimator="opo")
    seen = capture_lengths(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    (lengths,) = seen
    rewards = trainer._rewards_per_func[:, 0]
    expected = expected_opo(rewards, lengths)
    # the lengths the variant saw are those of the training rows; TRL shuffles rows: compare (length, A) multisets
    got = sorted(zip(inputs["completion_mask"].sum(-1).tolist(), inputs["advantages"].tolist()))
    want = sorted(zip(lengths.tolist(), expected.tolist()))
    assert [n for n, _ in got] == [n for n, _ in want]
    torch.testing.assert_close(torch.tensor([a for _, a in got]), torch.tensor([a for _, a in want]))
    assert expected.abs().sum() > 0 and torch.isfinite(inputs["advantages"]).all()
    # the length weighting matters on this batch: not the plain (Dr. GRPO) mean baseline
    plain = rewards - rewards.view(-1, 4).mean(1).repeat_interleave(4)
    assert not torch.allclose(expected, plain)
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("flags", [{"loss_type": "gmpo"}, {"loss_type": "dapo", "epsilon_high": 0.28}])
def test_composes(tmp_path, flags):
    trainer = ours(tmp_path, advantage_estimator="opo", **flags)
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())
