"""Run by test_multiprocess.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank builds the trainer, runs
one generation batch through the stages, and checks that its slice is the global computation's slice and that
every rank computed the same global numbers. Writes one JSON line per rank to the folder given as argv[1]."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.torchrun import finish  # noqa: E402
from trl_groupx.contracts import config_kwargs  # noqa: E402

CASES = {
    "grpo": {},
    "sign_adv": {"advantage_estimator": "sign_adv"},
    "gtpo_entropy": {"token_weighting": "gtpo_entropy"},
    "grpo_s": {"token_weighting": "gtpo_entropy", "gtpo_level": "sequence"},
}


def check(name: str, flags: dict, out_dir: Path) -> dict:
    # 2 processes × 4 rollouts, G = 4: each group lives on one process; with G = 8 a group spans both.
    group = 8 if name != "grpo" else 4
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / name, per_device_train_batch_size=4,
                            num_generations=group, **flags)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rank = trainer.accelerator.process_index
    rewards = trainer._rewards_per_func[:, 0]
    local_adv = output["advantages"]
    if local_adv.dim() == 2:
        local_adv = local_adv * output["completion_mask"]
        width = trainer.accelerator.gather(torch.tensor([local_adv.size(1)])).max().item()
        local_adv = torch.nn.functional.pad(local_adv, (0, width - local_adv.size(1)))
    gathered = trainer.accelerator.gather(local_adv)
    result = {"rank": rank, "case": name, "n_global": int(rewards.numel())}
    if name == "sign_adv":
        result["matches_formula"] = bool(torch.equal(gathered, 2 * rewards - 1))
    elif name == "grpo":
        expected = trl_groupx.get_variant("grpo_deepseekmath").fn(rewards, group)
        result["matches_formula"] = bool(torch.allclose(gathered, expected))
    else:  # recompute the token stage on the gathered inputs exactly as one process would
        ctx = trainer._token_context(output, rewards, group)
        variant = trainer.variants["token_weights"]
        expected = variant.fn(torch.zeros_like(rewards), ctx, **config_kwargs(variant.fn, trainer.args))
        expected = expected * ctx.completion_mask
        result["matches_formula"] = bool(torch.allclose(gathered, expected[:, : gathered.size(1)], atol=1e-6))
    all_rewards = gather_object([rewards.tolist()])
    result["ranks_agree_on_rewards"] = all(r == all_rewards[0] for r in all_rewards)
    return result


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(name, flags, out_dir)) for name, flags in CASES.items()]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
