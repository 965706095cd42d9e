"""Balanced Aggregation on the tiny model: the scale the trainer attaches equals BA's definition computed group by
group, the loss is BA's, the gradient differs from GRPO's sequence mean, micro-batch splits do not change it, and
`loss_aggregation="balanced"` works with another objective."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_split_invariant, ours


def _by_definition(advantages, lengths, group_size):
    """Reference c_i, one group and one sign class at a time: |S| / Σ_{j∈S} |o_j| (0 for empty rollouts)."""
    out = torch.zeros(len(advantages))
    for start in range(0, len(advantages), group_size):
        rows = range(start, start + group_size)
        for sign in (-1, 0, 1):
            members = [i for i in rows if int(torch.sign(advantages[i])) == sign and lengths[i] > 0]
            tokens = sum(int(lengths[i]) for i in members)
            for i in members:
                out[i] = len(members) / tokens
    return out


@pytest.mark.parametrize("peft", [False, True])
def test_scale_and_loss_follow_the_definition(tmp_path, peft):
    trainer = ours(tmp_path, peft, loss_type="balanced_agg")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    output = trainer._generate_and_score_completions(batch)  # rows still in group order
    adv, mask = output["advantages"], output["completion_mask"]
    lengths = mask.sum(-1)
    expected_c = _by_definition(adv, lengths, trainer.num_generations)
    torch.testing.assert_close(output["groupx_sequence_scale"], expected_c)
    assert len(set(lengths.tolist())) > 1 and (adv > 0).any() and (adv < 0).any()  # the check has teeth

    loss = trainer.compute_loss(trainer.model, output)
    # on-policy ρ = 1: l_it = -A_i; BA per group = Σ_S (|S|/G) · tokmean_S(l), averaged over groups
    g = trainer.num_generations
    per_group = []
    for start in range(0, len(adv), g):
        total = 0.0
        for sign in (-1, 0, 1):
            members = [i for i in range(start, start + g) if int(torch.sign(adv[i])) == sign and lengths[i] > 0]
            if members:
                tokens = sum(float(lengths[i]) for i in members)
                total += len(members) / g * sum(-float(adv[i]) * float(lengths[i]) for i in members) / tokens
        per_group.append(total)
    torch.testing.assert_close(loss.detach(), torch.tensor(sum(per_group) / len(per_group)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_sequence_mean(tmp_path, peft):
    _, g_grpo, _ = one_step(ours(tmp_path / "a", peft, loss_type="grpo"))
    _, g_ba, inputs = one_step(ours(tmp_path / "b", peft, loss_type="balanced_agg"))
    assert "groupx_sequence_scale" in inputs
    assert grads_differ(g_grpo, g_ba, atol=1e-7)


@pytest.mark.parametrize("scope", ["group", "batch"])
def test_split_invariant(tmp_path, scope):
    trainer = ours(tmp_path, loss_type="balanced_agg", balanced_agg_scope=scope, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2)
    assert_split_invariant(trainer)


def test_balanced_aggregation_with_another_objective_and_an_advantage_variant(tmp_path):
    _, g_seq, _ = one_step(ours(tmp_path / "a", loss_type="gmpo", advantage_estimator="sign_adv"))
    _, g_bal, inputs = one_step(ours(tmp_path / "b", loss_type="gmpo", loss_aggregation="balanced",
                                     advantage_estimator="sign_adv"))
    assert inputs["groupx_sequence_scale"].gt(0).any()
    assert grads_differ(g_seq, g_bal, atol=1e-7)
