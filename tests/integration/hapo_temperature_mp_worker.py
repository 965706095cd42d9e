"""Run by test_hapo_adaptive_temperature_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank samples its
slice of a generation batch with `hapo_adaptive_temperature`; the statistics every rank keeps for the next batch must
be those of both ranks' completion tokens together (recomputed here from an independent forward of each rank's rows,
gathered), identical on both ranks; the second batch then samples with them on both. Writes one JSON line per rank
to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.sampling.adaptive_temperature import STATE_KEY, EntropyStatistics, entropy_statistics  # noqa: E402


def check(out_dir: Path) -> dict:
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "hapo",
                            per_device_train_batch_size=4, num_generations=4, max_completion_length=12,
                            hapo_adaptive_temperature=True, hapo_temperature_tau=0.5,
                            hapo_temperature_official_sign=True)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
    with torch.no_grad():
        _, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, output["completion_ids"].size(1), compute_entropy=True)
    local = entropies[output["completion_mask"].bool()].tolist()
    every = gather_object([local])
    expected = entropy_statistics(torch.tensor([h for part in every for h in part]), 0.8)
    stored = EntropyStatistics(**trainer.variant_state[STATE_KEY])
    states = gather_object([list(stored)])
    trainer._generate_and_score_completions(batch)
    scales = gather_object([trainer._metrics["train"]["hapo/temperature_scale_mean"]])
    return {
        "rank": trainer.accelerator.process_index,
        "local_tokens": len(local),
        "global_tokens": sum(len(part) for part in every),
        "matches_global": all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(stored, expected, strict=True)),
        "matches_local_only": all(abs(a - b) <= 1e-6 for a, b in
                                  zip(stored, entropy_statistics(torch.tensor(local), 0.8), strict=True)),
        "ranks_agree": all(s == states[0] for s in states),
        "scales_agree": all(s == scales[0] for s in scales) and len(scales[0]) == 1 and scales[0][0] > 1.0,
    }


if __name__ == "__main__":
    run_worker(check)
