"""Run by test_dgrpo_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank loads the same perturbed teacher,
trains on one micro-batch of its own rows and checks that its teacher log-probs are the teacher's on those rows (an
independent forward), and that the logged reverse KL is the masked mean over both ranks' tokens, the same on both.
Writes one JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.toy import load_tiny_model, load_tiny_tokenizer  # noqa: E402


def perturbed_teacher(folder: Path) -> str:
    """The tiny model with seeded noise (the same weights on every rank), saved with the student's tokenizer."""
    model = load_tiny_model()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(folder)
    load_tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def check(out_dir: Path) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    teacher_path = perturbed_teacher(out_dir / f"teacher{rank}")
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "dgrpo",
                            per_device_train_batch_size=4, num_generations=8, loss_type="dgrpo",
                            opd_teacher_model=teacher_path)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(batch)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    t = inputs["completion_ids"].size(1)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path)
    with torch.no_grad():
        logits = teacher(input_ids=ids, attention_mask=att).logits[:, -t - 1 : -1] / trainer.temperature
        student = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, t)[0]
    expected = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = inputs["completion_mask"]
    k1 = (student - expected) * mask
    sums = gather_object([[k1.sum().item(), mask.sum().item()]])
    global_mean = sum(s for s, _ in sums) / sum(n for _, n in sums)
    logged = trainer._metrics["train"]["groupx/teacher_reverse_kl"][-1]
    every_rank = gather_object([logged])
    return {
        "rank": rank,
        "own_rows": bool(torch.allclose(inputs["groupx_teacher_logps"] * mask, expected * mask, atol=1e-5)),
        "logged_is_global_mean": abs(logged - global_mean) < 1e-5,
        "ranks_agree": all(abs(v - every_rank[0]) < 1e-7 for v in every_rank),
        "disagrees": abs(global_mean) > 1e-3,
        "finite_loss": bool(torch.isfinite(loss)),
    }


if __name__ == "__main__":
    run_worker(check)
