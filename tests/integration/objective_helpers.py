"""Helpers for the objective-stage training tests: off-policy steps (ratios ≠ 1) and the gradient-accumulation
split check (the same generation batch trained as one micro-batch or as two must give the same gradient)."""

from __future__ import annotations

import torch

import trl_groupx
from tests.conftest import build_trainer, one_step


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _old_logps(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, inputs["completion_ids"].size(1)
        )
    return old


def current_logps(trainer, inputs):
    """Per-token log-probs of the completions under the trainer's current weights (no grad)."""
    return _old_logps(trainer, inputs)


def _perturb(trainer):
    """Move the trainable weights the same way for every trainer built from the same model (ratios ≠ 1)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


def loss_and_grads(trainer, inputs, accumulation=1):
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def assert_on_policy_matches(tmp_path, peft, reference: dict, flags: dict) -> None:
    """One on-policy step (every ratio 1) with `flags` gives the same gradient as with `reference` (the objective
    reduces to that loss when nothing is clipped, gated or penalised)."""
    _, expected, _ = one_step(ours(tmp_path / "on_reference", peft, **reference))
    _, got, _ = one_step(ours(tmp_path / "on_variant", peft, **flags))
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], atol=1e-6, rtol=1e-5)


def off_policy_loss_and_grads(path, peft, batch=None, **flags):
    """Loss and gradients of one off-policy step (`off_policy_batch`, or `batch(trainer)`) of a fresh trainer."""
    trainer = ours(path, peft, **flags)
    return loss_and_grads(trainer, (batch or off_policy_batch)(trainer))


def off_policy_batch(trainer, seed=0):
    """One generation batch with the rollout log-probs taken before the weights are perturbed (as with
    `num_iterations=2`, second iteration): the returned inputs carry `old_per_token_logps` ≠ current log-probs."""
    trainer.model.train()
    torch.manual_seed(seed)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(seed)
    inputs = trainer._prepare_inputs(batch)
    old = _old_logps(trainer, inputs)
    _perturb(trainer)
    return {**inputs, "old_per_token_logps": old}


def split_and_merged(trainer, seed=0):
    """Loss and gradient of one generation batch of 8 rollouts (trainer built with `per_device_train_batch_size=4`,
    `gradient_accumulation_steps=2`), off-policy, trained (a) as TRL does: two micro-batches of 4, each loss scaled
    for accumulation, gradients summed; (b) as one micro-batch of 8 with no accumulation. Returns
    `((loss_a, grads_a), (loss_b, grads_b))`."""
    assert trainer.args.gradient_accumulation_steps == 2 and trainer.args.steps_per_generation == 2
    trainer.model.train()
    torch.manual_seed(seed)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(seed)
    trainer._step = 0
    first = trainer._prepare_inputs(batch)
    trainer._step = 1
    second = trainer._prepare_inputs(batch)
    halves = [{**x, "old_per_token_logps": _old_logps(trainer, x)} for x in (first, second)]
    _perturb(trainer)

    loss_a, grads_a = torch.zeros(()), {}
    for half in halves:
        loss, grads = loss_and_grads(trainer, half, accumulation=2)
        loss_a = loss_a + loss
        for k, g in grads.items():
            grads_a[k] = grads_a.get(k, 0) + g

    merged = {}
    for key, value in halves[0].items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            merged[key] = torch.cat([value, halves[1][key]])
        elif isinstance(value, list):
            merged[key] = value + halves[1][key]
        else:
            merged[key] = value
    spg = trainer.args.steps_per_generation
    trainer.args.steps_per_generation = 1  # one micro-batch is the whole generation batch
    try:
        loss_b, grads_b = loss_and_grads(trainer, merged, accumulation=1)
    finally:
        trainer.args.steps_per_generation = spg
    return (loss_a, grads_a), (loss_b, grads_b)


def assert_split_invariant(trainer, atol=1e-6):
    (loss_a, grads_a), (loss_b, grads_b) = split_and_merged(trainer)
    torch.testing.assert_close(loss_a, loss_b, atol=atol, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for k in grads_a:
        torch.testing.assert_close(grads_a[k], grads_b[k], atol=atol, rtol=1e-4)
