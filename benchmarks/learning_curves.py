"""Learning curves of GRPO variants on the shipped tiny arithmetic model (CPU, offline), several seeds per variant.

    python benchmarks/learning_curves.py --steps 150 --seeds 3
    python benchmarks/learning_curves.py --steps 150 --seeds 3 --merge     # only the configs the report lacks

Every configuration trains with trl_groupx.GRPOTrainer and the demo's defaults (trl_groupx.demo.DEMO_DEFAULTS) for
the same number of steps and the same number of rollouts per step (per_device_train_batch_size fixed at 64, so a
group size of 2 means 32 prompts per step); only the group size and the variant's flags change. After training,
sampled pass@1 (T=1, mean over 8 samples) and pass@8 are measured on 64 held-out problems (arithmetic_dataset(seed=99)).
Writes learning_curves.md, learning_curves.json and reward-vs-step PNGs (mean, min/max band over seeds) to --output-dir.

    python benchmarks/learning_curves.py --task mixed --steps 150 --seeds 3

`--task mixed` trains the difficulty-weighting family on an easy/hard mix (half in-distribution problems with operands
≤ 20, half with operands ≤ 40, which the base model solves 5% of the time) and reports pass@1 on each half separately;
it writes learning_curves_mixed.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_key, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

import trl_groupx  # noqa: E402
from trl_groupx.demo import DEMO_DEFAULTS  # noqa: E402
from trl_groupx.toy import arithmetic_dataset, arithmetic_reward, load_tiny_tokenizer, tiny_model_path  # noqa: E402

ROLLOUTS_PER_STEP = DEMO_DEFAULTS["per_device_train_batch_size"]  # 64 = 8 prompts x 8 completions


def _registry(variant_id: str) -> dict:
    return dict(trl_groupx.get_variant(variant_id).flags)


# One member per further catalog family: baselines (rloo, remax), trust region (clip_cov), surrogate (gpg), dense
# credit (s_grpo_tspmo), prompt selection (vade), staleness (offpolicy_grpo), all-fail rescue (gcpo_ref), rollout
# diversity + asymmetric KL (mdp_grpo). Plotted apart from the first list (learning_curves_families.png).
FAMILIES = ("rloo", "remax", "clip_cov", "gpg", "s_grpo_tspmo", "vade", "offpolicy_grpo", "gcpo_ref", "mdp_grpo")


def default_configs() -> dict[str, dict]:
    """name -> GRPOConfig flags. Variant flags come from the registry (the paper's defaults)."""
    configs = {"plain TRL (dapo)": {}}
    for vid in ("sign_adv", "gtpo_entropy", "gmpo", "focal_tailmiss", "softmax_grpo", "gfpo"):
        configs[vid] = _registry(vid)
    # GFPO's registry flags sample 16 and keep 8 (dropped rollouts are masked, the batch keeps its shape): with
    # generation_batch_size = 64 it samples the same 64 rollouts per step (4 prompts x 16) and trains on 32.
    configs["gfpo"]["generation_batch_size"] = ROLLOUTS_PER_STEP
    for g in (2, 4):
        configs[f"plain TRL, G={g}"] = {"num_generations": g}
        configs[f"sign_adv, G={g}"] = {**_registry("sign_adv"), "num_generations": g}
    # one member of each remaining family of the catalog that runs on this task (multi-turn step credit and the
    # second-model rows need an environment or a second model; efficiency variants leave the maths unchanged)
    for vid in FAMILIES[:7]:
        configs[vid] = _registry(vid)
    configs["gcpo_ref"] = {**_registry("gcpo_ref"), "gcpo_ref_column": "answer"}  # the toy's reference column
    # MDP-GRPO's three parts: per-completion temperatures, prospect-shaped advantages, asymmetric KL (G = 4)
    configs["mdp_grpo"] = {**_registry("mdp_grpo"), "num_generations": 4,
                           "generation_temperatures": [0.1, 0.4, 0.7, 1.0], "beta": 0.01, "beta_negative": 0.025}
    return configs


# Easy/hard mix for the difficulty-weighting variants (papers claim gains from weighting hard prompts up).
EASY_MAX_OPERAND, HARD_MAX_OPERAND = 20, 40


def mixed_configs() -> dict[str, dict]:
    configs = {"plain TRL (dapo)": {}}
    for vid in ("focal_tailmiss", "mathforge_dgpo", "gd2po"):
        configs[vid] = _registry(vid)
    return configs


def train_dataset(task: str):
    if task == "arithmetic":
        return arithmetic_dataset(n=2048, seed=1)
    from datasets import concatenate_datasets

    easy = arithmetic_dataset(n=1024, seed=1, max_operand=EASY_MAX_OPERAND)
    hard = arithmetic_dataset(n=1024, seed=2, max_operand=HARD_MAX_OPERAND)
    return concatenate_datasets([easy, hard]).shuffle(seed=0)


def task_metrics(model, tokenizer, task: str, seed: int) -> dict[str, float]:
    """Held-out metrics: pass@1 and pass@8 (arithmetic), or pass@1 on the easy and the hard half and pass@8 on the
    hard half (mixed)."""
    if task == "arithmetic":
        pass1, passk = evaluate(model, tokenizer, seed=seed)
        return {"pass@1": pass1, "pass@8": passk}
    easy1, _ = evaluate(model, tokenizer, seed=seed, max_operand=EASY_MAX_OPERAND)
    hard1, hard8 = evaluate(model, tokenizer, seed=seed, max_operand=HARD_MAX_OPERAND)
    return {"pass@1 easy": easy1, "pass@1 hard": hard1, "pass@8 hard": hard8}


def evaluate(
    model, tokenizer, n_problems: int = 64, k: int = 8, seed: int = 0, max_operand: int = EASY_MAX_OPERAND
) -> tuple[float, float]:
    """Sampled pass@1 (T=1; mean correctness over k samples) and pass@k on arithmetic_dataset(seed=99)."""
    data = arithmetic_dataset(n=n_problems, seed=99, max_operand=max_operand)
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in data["prompt"]]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=k,
                             max_new_tokens=DEMO_DEFAULTS["max_completion_length"], pad_token_id=tokenizer.pad_token_id)
    completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    answers = [a for a in data["answer"] for _ in range(k)]
    correct = torch.tensor(arithmetic_reward(completions, answers)).view(n_problems, k)
    return correct.mean().item(), (correct.max(dim=1).values.mean().item())


def run_one(flags: dict, steps: int, seed: int, workdir: Path, task: str = "arithmetic") -> dict:
    from trl_groupx import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    args = GRPOConfig(output_dir=str(workdir), max_steps=steps, **{**DEMO_DEFAULTS, **flags, "seed": seed})
    tokenizer = load_tiny_tokenizer()
    trainer = GRPOTrainer(model=tiny_model_path(), reward_funcs=arithmetic_reward, processing_class=tokenizer,
                          train_dataset=train_dataset(task), args=args)
    trainer.remove_callback(PrinterCallback)
    start = time.time()
    trainer.train()
    wall = time.time() - start
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"seed": seed, "rewards": rewards, "wall_s": wall, **task_metrics(trainer.model, tokenizer, task, seed)}


def _ms(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def environment() -> dict:
    import transformers
    import trl

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"python": platform.python_version(), "torch": torch.__version__, "trl": trl.__version__,
            "transformers": transformers.__version__, "cpu": f"{cpu} ({os.cpu_count()} cores, 1 thread used)"}


def write_report(results: dict, env: dict, steps: int, out: Path, task: str = "arithmetic") -> None:
    last = max(1, min(10, steps // 5))
    stem = "learning_curves" if task == "arithmetic" else f"learning_curves_{task}"
    metrics = [k for k in next(iter(results.values()))["runs"][0] if k.startswith("pass@")] if results else []
    held_out = ("64 held-out problems (arithmetic_dataset(seed=99))" if task == "arithmetic" else
                f"64 held-out problems per half (arithmetic_dataset(seed=99, max_operand={EASY_MAX_OPERAND} | "
                f"{HARD_MAX_OPERAND}))")
    lines = [f"# Learning curves ({task}): {steps} steps, {ROLLOUTS_PER_STEP} rollouts per step, tiny arithmetic model\n",
             f"Final reward = mean reward of the last {last} steps of each seed, then mean ± std over seeds. pass@1 is "
             f"sampled at T=1 (mean over 8 samples), pass@8 = any of 8 samples correct, on {held_out}; all mean ± std "
             "over seeds. Wall time = training only, mean per seed.\n",
             "| config | flags | seeds | final reward | " + " | ".join(metrics) + " | wall s/run |",
             "|---|---|---|---|" + "---|" * len(metrics) + "---|"]
    for name, r in results.items():
        finals = [statistics.mean(run["rewards"][-last:]) for run in r["runs"]]
        flags = ", ".join(f"{k}={v}" for k, v in r["flags"].items()) or "(none)"
        cells = " | ".join(_ms([x[m] for x in r["runs"]]) for m in metrics)
        lines.append(f"| {name} | {flags} | {len(r['runs'])} | {_ms(finals)} | {cells} "
                     f"| {statistics.mean(x['wall_s'] for x in r['runs']):.0f} |")
    lines += ["", "Machine: " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
    if task == "arithmetic":
        lines += ["![reward vs step, group size 8](learning_curves.png)", "",
                  "![reward vs step, small groups](learning_curves_small_groups.png)", "",
                  "![reward vs step, further families](learning_curves_families.png)", ""]
    else:
        lines += [f"![reward vs step]({stem}.png)", ""]
    (out / f"{stem}.md").write_text("\n".join(lines))
    (out / f"{stem}.json").write_text(
        json.dumps({"task": task, "steps": steps, "environment": env, "results": results}, indent=1)
    )


def plot(results: dict, names: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = max((len(results[name]["runs"][0]["rewards"]) for name in names), default=1)
    for name in names:
        curves = list(zip(*(run["rewards"] for run in results[name]["runs"])))
        # rewards are logged once per generation batch: steps_per_generation > 1 logs fewer points over the same steps
        x = [(i + 1) * steps / len(curves) for i in range(len(curves))]
        ax.plot(x, [statistics.mean(c) for c in curves], label=name, lw=1.2)
        ax.fill_between(x, [min(c) for c in curves], [max(c) for c in curves], alpha=0.15)
    ax.set(xlabel="step", ylabel="mean reward per step", ylim=(0, 1), title=title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def previous_results(out: Path, task: str, steps: int) -> dict:
    """The results of an existing report, refused if it was run with another task or step count."""
    stem = "learning_curves" if task == "arithmetic" else f"learning_curves_{task}"
    path = out / f"{stem}.json"
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    saved.setdefault("task", "arithmetic")  # reports written before --task existed
    if (saved["task"], saved["steps"]) != (task, steps):
        raise SystemExit(f"--merge: {path} has task={saved['task']!r}, steps={saved['steps']}; "
                         f"rerun with --task {saved['task']} --steps {saved['steps']} or without --merge")
    return saved["results"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--task", choices=["arithmetic", "mixed"], default="arithmetic",
                        help="arithmetic: the default list; mixed: difficulty weighting on an easy/hard mix")
    parser.add_argument("--configs", nargs="*", help="names from the task's list (all when omitted)")
    parser.add_argument("--output-dir", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--merge", action="store_true",
                        help="keep the other configs of --output-dir's report (same task and steps); run --configs "
                             "or, without --configs, the configs the report lacks")
    ns = parser.parse_args(argv)
    configs = default_configs() if ns.task == "arithmetic" else mixed_configs()
    out = Path(ns.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    env, results = environment(), {}
    if ns.merge:
        results = previous_results(out, ns.task, ns.steps)
    names = ns.configs or [n for n in configs if n not in results]
    unknown = [n for n in names if n not in configs]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {list(configs)}")
    for name in names:
        results[name] = {"flags": configs[name], "runs": []}
        for seed in range(ns.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                run = run_one(configs[name], ns.steps, seed, Path(tmp), ns.task)
            results[name]["runs"].append(run)
            shown = "  ".join(f"{k} {v:.3f}" for k, v in run.items() if k.startswith("pass@"))
            print(f"{name:<22} seed {seed}  last reward {run['rewards'][-1]:.3f}  {shown}  {run['wall_s']:.0f}s",
                  flush=True)
        results = {n: results[n] for n in configs if n in results}  # the list's order
        write_report(results, env, ns.steps, out, ns.task)  # partial results survive an interrupted run
    names = list(results)
    if ns.task != "arithmetic":
        plot(results, names, out / f"learning_curves_{ns.task}.png", "easy/hard mix (operands <= 20 | <= 40)")
        return results
    small = [n for n in names if ", G=" in n]
    families = [n for n in names if n in FAMILIES]
    plot(results, [n for n in names if n not in small and n not in families], out / "learning_curves.png",
         "group size 8 (gfpo: 16 → keep 8)")
    plot(results, ["plain TRL (dapo)"] * ("plain TRL (dapo)" in results) + families,
         out / "learning_curves_families.png", "one variant per further family (mdp_grpo: G = 4)")
    plot(results, small or names[:1], out / "learning_curves_small_groups.png", "small groups, 64 rollouts per step")
    return results


if __name__ == "__main__":
    main()
