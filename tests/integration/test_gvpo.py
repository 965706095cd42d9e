"""GVPO on the tiny model, full and LoRA: on-policy its gradient is Dr. GRPO's (centred rewards) times β·n/(n−1)·L_max;
off-policy the loss is the group-by-group formula on the trainer's own inputs; splitting a batch into whole groups
does not change it; it composes with an advantage variant; a real `train()` step with accumulation runs."""

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import current_logps, loss_and_grads, off_policy_batch, ours

PEFT = [False, True]
GVPO = {"loss_type": "gvpo", "scale_rewards": "none"}  # tiny-model defaults: num_generations=4, 8 rows per device


@pytest.mark.parametrize("peft", PEFT)
def test_on_policy_gradient_is_scaled_dr_grpo_and_differs_from_grpo(tmp_path, peft):
    # on-policy rθ = 0, so ∂L/∂logp_it = -β·n/(n−1)·Â_i/B; Dr. GRPO at ρ = 1 gives -Â_i/(B·L_max)
    # → GVPO's gradient = Dr. GRPO's (same centred advantages) × β·n/(n−1)·L_max = 0.1·4/3·6 = 0.8
    _, g_dr, _ = one_step(ours(tmp_path / "a", peft, loss_type="dr_grpo", scale_rewards="none"))
    trainer = ours(tmp_path / "b", peft, **GVPO)
    _, g_gvpo, inputs = one_step(trainer)
    assert inputs["advantages"].abs().sum() > 0
    scale = 0.1 * 4 / 3 * trainer.max_completion_length
    for k in g_dr:
        torch.testing.assert_close(g_gvpo[k], g_dr[k] * scale, atol=1e-7, rtol=1e-4)
    _, g_grpo, _ = one_step(ours(tmp_path / "c", peft, loss_type="grpo"))
    assert grads_differ(g_grpo, g_gvpo, atol=1e-7)


def _expected_loss(inputs, logps, beta):
    """Group by group, as the paper: Σ_{i∈g} ½((rθ_i − m_g) − Â_i)² / (n−1), averaged over the groups; rows without
    loss tokens out of m_g and of the sum."""
    ids, mask = inputs["groupx_group_ids"], inputs["completion_mask"]
    r_theta = beta * ((logps - inputs["old_per_token_logps"]) * mask).sum(-1)
    adv = inputs["advantages"]
    per_group = []
    for gid in ids.unique().tolist():
        rows = [i for i in range(len(ids)) if ids[i] == gid]
        active = [i for i in rows if mask[i].sum() > 0]
        m = sum(float(r_theta[i]) for i in active) / len(active)
        per_group.append(sum(0.5 * ((float(r_theta[i]) - m) - float(adv[i])) ** 2 for i in active) / (len(rows) - 1))
    return sum(per_group) / len(per_group), r_theta


@pytest.mark.parametrize("peft", PEFT)
def test_off_policy_loss_from_trainer_inputs(tmp_path, peft):
    trainer = ours(tmp_path, peft, **GVPO)
    inputs = off_policy_batch(trainer)
    ids = inputs["groupx_group_ids"]
    assert sorted(torch.bincount(ids - ids.min()).tolist()) == [4, 4]  # two whole groups, rows shuffled
    loss, _ = loss_and_grads(trainer, inputs)
    expected, r_theta = _expected_loss(inputs, current_logps(trainer, inputs), 0.1)
    assert r_theta.abs().min() > 1e-4 and inputs["advantages"].abs().sum() > 0  # the check has teeth
    torch.testing.assert_close(loss, torch.tensor(expected), atol=1e-6, rtol=1e-5)


def _rows(inputs, rows):
    n = inputs["completion_ids"].size(0)
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0 and value.size(0) == n:
            out[key] = value[rows]
        elif isinstance(value, list) and len(value) == n:
            out[key] = [v for v, keep in zip(value, rows.tolist()) if keep]
        else:
            out[key] = value
    return out


def test_whole_group_micro_batches_give_the_same_step(tmp_path):
    # the same 2 groups as one micro-batch, or as one micro-batch per group with accumulation 2 (each loss / 2):
    # same loss and gradient (the official sum over the micro-batch would double in the first case)
    trainer = ours(tmp_path, **GVPO)
    inputs = off_policy_batch(trainer)
    loss_whole, g_whole = loss_and_grads(trainer, inputs)
    ids = inputs["groupx_group_ids"]
    loss_split, g_split = torch.zeros(()), {}
    for gid in ids.unique():
        loss, grads = loss_and_grads(trainer, _rows(inputs, ids == gid), accumulation=2)
        loss_split = loss_split + loss
        for k, g in grads.items():
            g_split[k] = g_split.get(k, 0) + g
    torch.testing.assert_close(loss_whole, loss_split, atol=1e-7, rtol=1e-5)
    for k in g_whole:
        torch.testing.assert_close(g_whole[k], g_split[k], atol=1e-7, rtol=1e-4)


def test_composes_with_rloo_advantages(tmp_path):
    # RLOO's Â = n/(n−1)·(R − mean R) = 4/3 × the centred rewards → on-policy gradient × 4/3
    _, base, base_inputs = one_step(ours(tmp_path / "a", **GVPO))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="gvpo", advantage_estimator="rloo"))
    torch.testing.assert_close(inputs["advantages"], base_inputs["advantages"] * 4 / 3)
    for k in base:
        torch.testing.assert_close(grads[k], base[k] * 4 / 3, atol=1e-7, rtol=1e-4)


def test_real_train_step_with_accumulation(tmp_path):
    trainer = ours(tmp_path, **GVPO, gradient_accumulation_steps=2, steps_per_generation=1, num_iterations=2,
                   max_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses and all(torch.isfinite(torch.tensor(x)) for x in losses)
