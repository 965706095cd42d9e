"""Run by test_rto_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank loads the same perturbed DPO
model and trains on its own rows (groups of 8 straddle the two ranks); its trained token advantages must be its own
rows' GRPO advantage plus the reward-to-go of their clipped DPO token rewards, recomputed here from an independent
forward. Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.dgrpo_mp_worker import perturbed_teacher  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402


def one_batch(trainer):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer._prepare_inputs(batch)


def check(out_dir: Path) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    dpo_path = perturbed_teacher(out_dir / f"dpo{rank}")
    common = dict(per_device_train_batch_size=4, num_generations=8, beta=0.04)
    grpo = one_batch(build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "grpo", **common))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "rto", token_weighting="rto",
                            rto_dpo_model=dpo_path, rto_dpo_reward_scale=0.5, rto_dpo_reward_clip=0.3, **common)
    inputs = one_batch(trainer)
    loss = trainer.compute_loss(trainer.model, inputs)
    t = inputs["completion_ids"].size(1)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(dpo_path)(input_ids=ids, attention_mask=att).logits
        ref = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, att, t)[0]
    dpo = torch.log_softmax(logits[:, -t - 1 : -1] / trainer.temperature, -1).gather(
        -1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = inputs["completion_mask"]
    to_go = ((0.5 * (dpo - ref)).clamp(-0.3, 0.3) * mask).flip(-1).cumsum(-1).flip(-1)  # policy = ref: no KL reward
    expected = (grpo["advantages"][:, None] + to_go) * mask
    return {
        "rank": rank,
        "same_rollouts": bool(torch.equal(inputs["completion_ids"], grpo["completion_ids"])),
        "own_rows": bool(torch.allclose(inputs["advantages"], expected, atol=1e-5)),
        "token_rewards": bool(to_go.abs().max() > 0.05),
        "finite_loss": bool(torch.isfinite(loss)),
    }


if __name__ == "__main__":
    run_worker(check)
