"""Run by test_sppo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): advantage_estimator="sppo" with one
rollout per prompt. Each rank scores its own prompts with the value model, the logits are gathered, and the value
model's BCE step (each rank's gradient summed over ranks) must leave both ranks with the same weights, equal to one
step on the whole global batch in a single process. Writes one JSON line per rank to the folder given as argv[1]."""

import contextlib
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.advantages.sppo_value import load_value_model  # noqa: E402
from trl_groupx.toy import tiny_model_path  # noqa: E402


def checksum(model: torch.nn.Module) -> list[float]:
    flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    weights = torch.linspace(-1.0, 1.0, flat.numel(), dtype=torch.float64)
    return [flat.sum().item(), (flat * weights).sum().item()]


def check(out_dir: Path) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "sppo",
                            per_device_train_batch_size=4, num_generations=1, advantage_estimator="sppo",
                            sppo_value_model=tiny_model_path(), sppo_value_lr=1e-3)
    value = trainer._sppo_value
    # an independent copy of the value model, built by the same loader (same seeded head), kept out of the trainer
    live_state, trainer.variant_state = trainer.variant_state, {}
    reference = load_value_model(trainer)
    trainer.variant_state = live_state
    reference.accelerator = types.SimpleNamespace(num_processes=1, autocast=contextlib.nullcontext)
    start = checksum(value.model)
    stepped = {"trainer": [], "reference": []}  # the gradients each optimizer step uses (summed over ranks)
    for name, owner in (("trainer", value), ("reference", reference)):
        step = owner.optimizer.step

        def recording_step(step=step, owner=owner, name=name):
            stepped[name].append([p.grad.clone() for p in owner.model.parameters()])
            return step()

        owner.optimizer.step = recording_step
    same_start = checksum(reference.model) == start

    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(batch)  # generation, value logits, advantages, the value model's step
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()

    ids, mask = inputs["prompt_ids"], inputs["prompt_mask"]
    before = reference.logits(ids, mask)  # the value before its step, on this rank's (shuffled) rows
    rewards = inputs["advantages"].float() + torch.sigmoid(before)  # A = R − σ(V)  ⇒  R ∈ {0, 1} (parity reward)
    binary = bool(torch.allclose(rewards, rewards.round(), atol=1e-5))
    acc = trainer.accelerator
    global_ids = acc.gather(acc.pad_across_processes(ids, dim=1, pad_index=0, pad_first=True))
    global_mask = acc.gather(acc.pad_across_processes(mask, dim=1, pad_index=0, pad_first=True))
    global_rewards = acc.gather(rewards.round())
    reference.update(global_ids, global_mask, global_rewards, start=0)  # one process, the whole global batch
    # Adam's first step is lr·g/(|g| + 1e-8): near-zero gradients make the weights ill-conditioned to compare, so the
    # gradients of the step are compared (their summation order differs), and the weights within lr
    (mine,), (single,) = stepped["trainer"], stepped["reference"]
    grad_diff = max((a - b).abs().max().item() for a, b in zip(mine, single))
    grad_scale = max(b.abs().max().item() for b in single)
    diff = max((p - q).abs().max().item() for p, q in zip(value.model.parameters(), reference.model.parameters()))
    every_rank = gather_object([checksum(value.model)])
    return {
        "rank": rank,
        "same_start": same_start,
        "advantages_are_reward_minus_value": binary,
        "matches_one_process_step": grad_diff < 1e-6 * grad_scale and diff <= 1e-3 + 1e-6,
        "grad_diff": grad_diff, "grad_scale": grad_scale, "weight_diff": diff,
        "moved": checksum(value.model) != start,
        "ranks_agree": all(c == every_rank[0] for c in every_rank),
        "finite_loss": bool(torch.isfinite(loss)),
        "rows": int(global_rewards.numel()),
    }


if __name__ == "__main__":
    run_worker(check)
