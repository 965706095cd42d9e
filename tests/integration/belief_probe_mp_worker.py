"""Run by test_belief_probe_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): each rank runs one generation batch
(one group spans both ranks) through belief_probe and checks that both ranks hold the same global segment ids and
answer log-probs, that those of its own first row equal an independent unpadded forward, that its slice of the token
advantages is the global computation's slice, and that both ranks ran the same number of probe forwards. Writes one
JSON line per rank to the folder given as argv[1]."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer  # noqa: E402
from tests.integration.test_belief_probe import FLAGS, boundaries_of  # noqa: E402
from tests.integration.torchrun import run_worker  # noqa: E402
from trl_groupx.contracts import config_kwargs  # noqa: E402
from trl_groupx.token_weights import belief_probe_forward  # noqa: E402


class CountingModel(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, **kwargs):
        self.calls += 1
        return self.model(**kwargs)


def check(out_dir: Path) -> dict:
    group = 8  # 2 processes × 4 rollouts: one group spans both processes
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "vps", max_completion_length=8,
                            per_device_train_batch_size=4, num_generations=group, **FLAGS)
    trainer.model.train()
    torch.manual_seed(1)
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    rank, local_n = trainer.accelerator.process_index, output["completion_ids"].size(0)
    rewards = trainer._rewards_per_func[:, 0]
    local = output["advantages"] * output["completion_mask"]
    width = trainer.accelerator.gather(torch.tensor([local.size(1)])).max().item()
    gathered = trainer.accelerator.gather(torch.nn.functional.pad(local, (0, width - local.size(1))))
    ctx = trainer._token_context(output, rewards, group)
    # forward counts: rank 1 keeps a single probe, rank 0 all of its own; with chunks of 4 both must still run
    # ⌈rank 0's probes / 4⌉ forwards
    counted, probes = {}, {}
    real_probe, real_local = belief_probe_forward.probe_answer_logps, belief_probe_forward.local_probes

    def local_probes(*args):
        segments, targets, sequences, lengths = real_local(*args)
        if rank == 1:
            targets, sequences, lengths = targets[:1], sequences[:1], lengths[:1]
        probes["n"] = len(sequences)
        return segments, targets, sequences, lengths

    def probe(model, *args, **kwargs):
        counter = CountingModel(model)
        out = real_probe(counter, *args, **kwargs)
        counted["forwards"] = counter.calls
        return out

    belief_probe_forward.probe_answer_logps, belief_probe_forward.local_probes = probe, local_probes
    trainer._token_context(output, rewards, group)
    belief_probe_forward.probe_answer_logps, belief_probe_forward.local_probes = real_probe, real_local
    variant = trainer.variants["token_weights"]
    seq = trl_groupx.get_variant("grpo_deepseekmath").fn(rewards, group)
    expected = variant.fn(seq, ctx, **config_kwargs(variant.fn, trainer.args))[:, :width]
    # this rank's first row sits at its global row: its beliefs equal an independent unpadded forward
    row, tok = rank * local_n, trainer.processing_class
    n0 = int(output["completion_mask"][0].sum())
    ids = output["completion_ids"][0, :n0].tolist()
    bounds = boundaries_of(ctx.belief_segment_ids[row], n0, ids[-1] in trainer.eos_token_ids)
    answer = tok(str(trainer._rollout_inputs[0]["answer"]), add_special_tokens=False)["input_ids"]
    before = tok("\nThe answer is ", add_special_tokens=False)["input_ids"]
    prompt = output["prompt_ids"][0][output["prompt_mask"][0].bool()].tolist()
    model = trainer.accelerator.unwrap_model(trainer.model)
    own = []
    for c in bounds:
        seq_ids = torch.tensor([prompt + ids[:c] + before + answer])
        with torch.no_grad():
            logits = model(input_ids=seq_ids).logits[0, :-1] / trainer.temperature
        own.append(torch.log_softmax(logits, -1).gather(-1, seq_ids[0, 1:, None]).squeeze(-1)[-len(answer):].sum())
    every_rank = gather_object([[gathered.tolist(), ctx.belief_segment_ids.tolist(),
                                 torch.nan_to_num(ctx.answer_belief_logps, nan=99.0).tolist()]])
    counts = gather_object([[probes["n"], counted["forwards"]]])
    return {
        "rank": rank,
        "n_global": int(rewards.numel()),
        "matches_formula": bool(torch.allclose(gathered, expected, atol=1e-5)),
        "own_row_beliefs": bool(torch.allclose(ctx.answer_belief_logps[row, : len(bounds)], torch.stack(own),
                                               atol=1e-4, rtol=1e-4)),
        "ranks_agree": all(g == every_rank[0] for g in every_rank),
        "probes": [c[0] for c in counts],
        "forwards": [c[1] for c in counts],
    }


if __name__ == "__main__":
    run_worker(check)
