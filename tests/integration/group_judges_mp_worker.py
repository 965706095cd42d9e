"""Run by test_group_judges_mp.py under `torchrun --nproc_per_node 2` (gloo, CPU): 12 rollouts in groups of 4 over two
ranks of 6, so group 1 (global rows 4..7) straddles them. For SGPO's judge (allneg_aifeedback) and VeriGate's step PRM
(verigate_step), each rank must call the component on its own rows of the selected groups only, selected on the
global rewards, and train on advantages computed from every rank's scores. Writes one JSON line per rank to the
folder given as argv[1]."""

import json
import math
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
from trl_groupx.advantages import group_normalized_advantages  # noqa: E402
from trl_groupx.advantages.allneg_aifeedback import allneg_aifeedback_advantages, register_allneg_judge  # noqa: E402
from trl_groupx.token_weights.verigate_step import register_step_prm  # noqa: E402

G, LOCAL = 4, 6
TEXTS: list[str] = []  # this rank's completion texts of the last batch, in row order


def half_failing_verifier(completions, **kwargs) -> list[float]:
    """0 on every completion of group 1 (global rows 4..7, the group split over the two ranks: all-negative and
    degenerate), else 1 on odd global rows (groups 0 and 2 mix)."""
    TEXTS[:] = [c[0]["content"] for c in completions]
    start = int(os.environ.get("RANK", "0")) * LOCAL
    return [0.0 if 4 <= start + i < 8 else float((start + i) % 2) for i in range(len(completions))]


def judge_score(text: str) -> float:
    return min(1.0, 0.15 * len(text))


def step_score(step: str) -> float:
    return (sum(map(ord, step)) % 5) / 4


SEEN: dict[str, list] = {"judge": [], "prm": []}


def judge(prompts, completions, **kwargs):
    SEEN["judge"].extend(c[0]["content"] for c in completions)
    return [judge_score(c[0]["content"]) for c in completions]


def prm(prompts, completions, steps, **kwargs):
    SEEN["prm"].extend(steps)
    return [[step_score(s) for s in row] for row in steps]


def one_batch(trainer):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer._prepare_inputs(batch)


def selected_local_rows(selected: torch.Tensor, rank: int) -> list[int]:
    return [i for i in range(LOCAL) if selected[rank * LOCAL + i]]


def check_sgpo(out_dir: Path, rank: int) -> dict:
    register_allneg_judge("mp_judge", judge)
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "sgpo",
                            reward_funcs=[half_failing_verifier], per_device_train_batch_size=LOCAL, num_generations=G,
                            advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="mp_judge")
    inputs = one_batch(trainer)
    loss = trainer.compute_loss(trainer.model, inputs)
    rewards = trainer._rewards_per_func[:, 0].cpu()
    all_neg = (rewards.view(-1, G).amax(1) == 0).repeat_interleave(G)
    texts = gather_object(list(TEXTS))  # every rank's texts, global order
    scores = torch.tensor([judge_score(t) if all_neg[i] else math.nan for i, t in enumerate(texts)])
    expected = allneg_aifeedback_advantages(rewards, G, judge_scores=scores)[rank * LOCAL:(rank + 1) * LOCAL]
    mine = [TEXTS[i] for i in selected_local_rows(all_neg, rank)]
    return {
        "sgpo_only_straddling_group": all_neg.tolist() == [i in range(4, 8) for i in range(3 * G)],
        "sgpo_own_rows_only": SEEN["judge"] == mine,
        "sgpo_advantages": bool(torch.allclose(inputs["advantages"].sort().values.cpu(), expected.sort().values,
                                               atol=1e-6)),
        "sgpo_finite_loss": bool(torch.isfinite(loss)),
    }


def check_verigate_step(out_dir: Path, rank: int) -> dict:
    register_step_prm("mp_prm", prm)
    # delimiter "4": the seeded batch has a row of group 1 with text after a "4", so some row has two steps
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, out_dir / "vgs",
                            reward_funcs=[half_failing_verifier], per_device_train_batch_size=LOCAL, num_generations=G,
                            token_weighting="verigate_step", verigate_step_prm="mp_prm", verigate_step_delimiter="4")
    inputs = one_batch(trainer)
    loss = trainer.compute_loss(trainer.model, inputs)
    rewards = trainer._rewards_per_func[:, 0].cpu()
    degenerate = (rewards.view(-1, G).amax(1) == rewards.view(-1, G).amin(1)).repeat_interleave(G)
    rows = selected_local_rows(degenerate, rank)
    steps = dict(gather_object([(rank * LOCAL + i, s) for i, s in zip(rows, SEEN["prm"], strict=True)]))
    allowed = []  # every value a degenerate group's tokens may take: its pooled reward-to-go z-scores
    for g in range(rewards.numel() // G):
        members = [steps[i] for i in range(g * G, g * G + G) if i in steps]
        pooled = [sum(step_score(s) for s in row[k:]) for row in members for k in range(len(row))]
        if len(pooled) > 1:
            mean = sum(pooled) / len(pooled)
            std = math.sqrt(sum((r - mean) ** 2 for r in pooled) / (len(pooled) - 1))
            allowed += [(r - mean) / (std + 1e-4) for r in pooled]
    grpo = group_normalized_advantages(rewards, G)[~degenerate].tolist()
    mask = inputs["completion_mask"].bool().cpu()
    adv = inputs["advantages"].cpu()
    values = [v for i in range(adv.shape[0]) for v in adv[i][mask[i]].tolist()]
    return {
        "vgs_only_straddling_group": degenerate.tolist() == [i in range(4, 8) for i in range(3 * G)],
        "vgs_several_steps": any(len(row) > 1 for row in steps.values()),
        "vgs_own_rows_only": ["".join(s) for s in SEEN["prm"]] == [TEXTS[i] for i in rows],
        "vgs_token_values": all(any(abs(v - a) < 1e-4 for a in allowed + grpo) for v in values),
        "vgs_padding_zero": bool((adv[~mask] == 0).all()),
        "vgs_finite_loss": bool(torch.isfinite(loss)),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    result = {"rank": rank, **check_sgpo(out_dir, rank), **check_verigate_step(out_dir, rank)}
    (out_dir / f"rank{rank}.jsonl").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    finish()
