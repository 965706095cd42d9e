"""Run by test_nat_multiprocess.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank runs one generation batch
through NAT and checks that its slice of the Horvitz–Thompson token advantages is the global computation's slice and
that both ranks drew the same token selection. Writes one JSON line per rank to the folder given as argv[1]."""

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


def check(scheme: str, out_dir: Path) -> dict:
    group = 8  # 2 processes × 4 rollouts: one group spans both processes
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / scheme,
                            per_device_train_batch_size=4, num_generations=group, token_weighting="nat",
                            nat_scheme=scheme)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0]
    local = output["advantages"] * output["completion_mask"]
    width = trainer.accelerator.gather(torch.tensor([local.size(1)])).max().item()
    gathered = trainer.accelerator.gather(torch.nn.functional.pad(local, (0, width - local.size(1))))
    ctx = trainer._token_context(output, rewards, group)
    variant = trainer.variants["token_weights"]
    seq = trl_groupx.get_variant("grpo_deepseekmath").fn(rewards, group)
    expected = variant.fn(seq, ctx, **config_kwargs(variant.fn, trainer.args), global_step=0)[:, :width]
    every_rank = gather_object([gathered.tolist()])
    return {
        "rank": trainer.accelerator.process_index,
        "scheme": scheme,
        "n_global": int(rewards.numel()),
        "matches_formula": bool(torch.allclose(gathered, expected, atol=1e-5)),
        "some_dropped": bool(((gathered == 0) & (ctx.completion_mask[:, :width] > 0) & (seq[:, None] != 0)).any()),
        "ranks_agree": all(g == every_rank[0] for g in every_rank),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    lines = [json.dumps(check(scheme, out_dir)) for scheme in ("urs", "rpc")]
    (out_dir / f"rank{os.environ.get('RANK', '0')}.jsonl").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
    finish()
