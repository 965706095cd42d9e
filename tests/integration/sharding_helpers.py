"""Shared by test_multiprocess_sharding.py (single process, in pytest) and mp_sharding_worker.py (torchrun, 2 processes):
train a few steps on the tiny model with generation replaced by a deterministic function of (global step, global
rollout index), so that one process with the whole batch and two processes with half of it each see exactly the same
rollouts, and record what every stage produced.

The global batch is 12 rollouts in groups of 4 (3 groups): with 2 processes × 6 rollouts the middle group is split
across the two ranks, so every group statistic has to be computed on the gathered batch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

GLOBAL_BATCH = 12
GROUP = 4
MAX_COMPLETION = 6

# Plain SGD (lr 0.05) for the comparisons: unlike Adam's first steps (≈ lr·sign(g)), its update is proportional to the
# gradient, so a wrong global normalisation (e.g. a loss divided by the local instead of the global count) shows in
# the weights. The checkpoint case keeps TRL's AdamW, whose moments must survive the change of launcher.
SGD = {"optim": "sgd", "learning_rate": 0.05}

# One variant per stage and a stateful one; the other stateful variants have their own torchrun workers
# (test_stateful_contract.py checks that each has one).
CASES: dict[str, dict[str, Any]] = {
    "gfpo": {"rollout_filter": "gfpo", "gfpo_keep": 2, **SGD},  # sampling
    "zero_variance_filter": {"rollout_filter": "zero_variance_filter", **SGD},  # sampling
    "d3s": {"rollout_filter": "d3s", **SGD},  # sampling on a schedule over (global_step, total_steps)
    "sign_adv": {"advantage_estimator": "sign_adv", **SGD},  # advantages
    "ebpo": {"advantage_estimator": "ebpo"},  # advantages, stateful
    "gtpo_entropy": {"token_weighting": "gtpo_entropy", **SGD},  # token weights (needs entropies of the gathered batch)
    "dcpo": {"token_weighting": "dcpo", **SGD},  # token weights, stateful (the batch's mean NLL, global)
    "gmpo": {"loss_type": "gmpo", "gmpo_clip": 0.4, "loss_aggregation": "sequence_mean", **SGD},  # objective
}
CHECKPOINT_CASE = "ebpo"  # the stateful one: saved at step 1, resumed under the other launcher


def _fake_generate(trainer):
    """Replacement for TRL's `_generate_single_turn` (transformers path): completion `j` of this process is seeded by
    (global step, its global index), independent of how the batch is split across processes."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        n = len(prompt_ids)
        first = trainer.accelerator.process_index * n
        completions = []
        for j in range(n):
            gen = torch.Generator().manual_seed(10_000 * trainer.state.global_step + first + j)
            length = int(torch.randint(1, MAX_COMPLETION + 1, (1,), generator=gen))
            completions.append(torch.randint(3, 104, (length,), generator=gen).tolist())  # tiny vocab: 104, 0-2 special
        return completions, None

    return generate


def _record_rollouts(trainer) -> list[torch.Tensor]:
    """Record, per generation batch, the gathered `(N_global, ...)` advantages as the stages left them (before TRL
    shuffles the batch into micro-batches) in the returned list, and the kept rollouts in `trainer._recorded_kept`."""
    advantages: list[torch.Tensor] = []
    trainer._recorded_kept = []
    generate_and_score = trainer._generate_and_score_completions

    def recording_generate_and_score(inputs):
        output = generate_and_score(inputs)
        adv = output["advantages"].detach()
        if adv.dim() == 2:  # token-level: mask and pad to a fixed width so that ranks can be concatenated
            adv = adv * output["completion_mask"]
            adv = torch.nn.functional.pad(adv, (0, MAX_COMPLETION - adv.size(1)))
        advantages.append(trainer.accelerator.gather(adv).cpu())
        trainer._recorded_kept.append(trainer.accelerator.gather(output["completion_mask"].sum(-1) > 0).cpu())
        return output

    trainer._generate_and_score_completions = recording_generate_and_score
    return advantages


def run_job(out_dir: Path, flags: dict[str, Any], *, max_steps: int = 2, save: bool = False,
            resume_from: str | None = None) -> dict[str, Any] | None:
    """Train `max_steps` steps (resuming from `resume_from` if given) with this launcher's process count; return on
    rank 0 (None elsewhere) the per-step gathered advantages, per-step per-rank losses, final weights, variant state
    and whether every rank held the same variant state."""
    from accelerate.utils import gather_object

    import trl_groupx
    from tests.conftest import build_trainer

    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun; the process group starts with the trainer
    saving = {"save_strategy": "steps", "save_steps": 1} if save else {}
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir,
                            per_device_train_batch_size=GLOBAL_BATCH // world, num_generations=GROUP,
                            max_completion_length=MAX_COMPLETION, max_steps=max_steps, **{**saving, **flags})
    assert trainer.accelerator.num_processes == world
    trainer._generate_single_turn = _fake_generate(trainer)
    advantages, losses = _record_rollouts(trainer), []

    compute_loss = trainer.compute_loss

    def recording_compute_loss(model, inputs, *args, **kwargs):
        loss = compute_loss(model, inputs, *args, **kwargs)
        losses.append(gather_object([loss.item()]))
        return loss

    trainer.compute_loss = recording_compute_loss
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train(resume_from_checkpoint=resume_from)

    states = gather_object([trainer.variant_state])
    if trainer.accelerator.process_index != 0:
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {
        "world": world,
        "advantages": advantages,
        "kept": trainer._recorded_kept,
        "losses": losses,
        "weights": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
        "deltas": {n: (p.detach() - initial[n]).cpu() for n, p in model.named_parameters()},
        "state": states[0],
        "ranks_agree_on_state": all(_equal(s, states[0]) for s in states),
        "global_step": trainer.state.global_step,
    }


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if torch.is_tensor(a):
        return torch.is_tensor(b) and torch.equal(a, b)
    return a == b


# FSDP2 (torch `fully_shard`, gloo, CPU): accelerate enables its FSDP plugin only for GPU-type backends, so the
# Trainer cannot be launched with FSDP on CPU. What can be checked is trl_groupx's own code on a sharded model: the
# token-weight stage's no-grad forward (entropies) and the objective's loss and backward, on a model sharded per
# decoder layer across the two processes (one step, no optimizer).
FSDP2_CASES: dict[str, dict[str, Any]] = {
    "gtpo_entropy": CASES["gtpo_entropy"],
    "gmpo": CASES["gmpo"],
}


def fsdp2_one_step(out_dir: Path, flags: dict[str, Any]) -> dict[str, Any] | None:
    """One generation + loss + backward; with 2 processes the model is sharded with FSDP2 first. Returns on rank 0 the
    gathered advantages, the per-rank losses and the full (unsharded) gradients."""
    from accelerate.utils import gather_object

    import trl_groupx
    from tests.conftest import build_trainer, one_step

    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir,
                            per_device_train_batch_size=GLOBAL_BATCH // world, num_generations=GROUP,
                            max_completion_length=MAX_COMPLETION, **flags)
    trainer._generate_single_turn = _fake_generate(trainer)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in trainer.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(trainer.model, mesh=mesh)
        assert type(trainer.model).__name__.startswith("FSDP")
    advantages = _record_rollouts(trainer)
    loss, grads, _ = one_step(trainer)
    grads = {n: (g.full_tensor() if hasattr(g, "full_tensor") else g).cpu() for n, g in grads.items()}
    losses = gather_object([loss.item()])
    if trainer.accelerator.process_index != 0:
        return None
    return {"world": world, "advantages": advantages[0], "losses": losses, "grads": grads}
