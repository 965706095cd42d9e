"""The shipped demo: GRPO with a variant on the tiny arithmetic model, on CPU, offline, in a few minutes.

    trl-groupx demo                                  # sign_adv advantages, the default
    trl-groupx demo --flag loss_type=gmpo --steps 40 # any GRPOConfig flag

Prints the mean reward per step and writes `reward_curve.png` (and `log_history.json`) to the output folder.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

DEMO_DEFAULTS: dict[str, Any] = dict(
    use_cpu=True,
    bf16=False,
    num_generations=8,
    per_device_train_batch_size=64,  # 8 prompts × 8 completions per step
    max_completion_length=8,
    learning_rate=3e-4,  # 1e-3 and above collapse the tiny model within a few dozen steps
    lr_scheduler_type="constant",
    temperature=1.0,
    beta=0.0,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    gradient_checkpointing=False,
    disable_tqdm=True,
    seed=0,
)


def parse_flags(pairs: list[str]) -> dict[str, Any]:
    """`["loss_type=gmpo", "gmpo_clip=0.3"]` → `{"loss_type": "gmpo", "gmpo_clip": 0.3}` (values parsed as YAML)."""
    flags = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"--flag expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        flags[key.strip()] = yaml.safe_load(value)
    return flags


def run_demo(steps: int = 300, output_dir: str = "demo-output", flags: dict[str, Any] | None = None) -> list[float]:
    """Train the tiny model for `steps` steps; returns the mean reward of each step and writes the plot."""
    import torch

    torch.set_num_threads(1)  # the tiny model is faster on one thread than two contending ones

    from .config import GRPOConfig
    from .toy import arithmetic_dataset, arithmetic_reward, load_tiny_tokenizer, tiny_model_path
    from .trainer import GRPOTrainer

    flags = {"advantage_estimator": "sign_adv"} if flags is None else flags
    args = GRPOConfig(output_dir=output_dir, max_steps=steps, **{**DEMO_DEFAULTS, **flags})
    print(f"trl_groupx demo: {steps} GRPO steps on the tiny arithmetic model, flags {flags or '(plain TRL)'}")
    trainer = GRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=arithmetic_reward,
        train_dataset=arithmetic_dataset(n=2048, seed=1),
        processing_class=load_tiny_tokenizer(),
        args=args,
    )
    trainer.remove_callback(PrinterCallback)  # one readable line per step instead of the full metrics dict
    trainer.add_callback(_RewardPrinter())
    start = time.time()
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    _plot(rewards, flags, out / "reward_curve.png")
    first, last = _mean(rewards[:5]), _mean(rewards[-5:])
    print(f"mean reward: first 5 steps {first:.3f} → last 5 steps {last:.3f} ({time.time() - start:.0f}s)")
    print(f"wrote {out / 'reward_curve.png'}")
    return rewards


def _mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def _plot(rewards: list[float], flags: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, marker=".", label="mean reward per step")
    window = 5
    if len(rewards) >= window:
        smooth = [_mean(rewards[i - window + 1 : i + 1]) for i in range(window - 1, len(rewards))]
        ax.plot(range(window, len(rewards) + 1), smooth, label=f"{window}-step average")
    ax.set_xlabel("step")
    ax.set_ylabel("reward (exact answer)")
    ax.set_ylim(0, 1)
    ax.set_title(f"trl_groupx demo: {', '.join(f'{k}={v}' for k, v in flags.items()) or 'plain GRPO'}", fontsize=9)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class _RewardPrinter(TrainerCallback):
    """Prints one line per logged step through the Trainer's own logging events."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            print(f"step {state.global_step:4d}  reward {logs['reward']:.3f}  loss {logs.get('loss', float('nan')):+.4f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="trl-groupx demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--output-dir", default="demo-output")
    parser.add_argument("--flag", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig flag")
    ns = parser.parse_args(argv)
    run_demo(ns.steps, ns.output_dir, parse_flags(ns.flag) if ns.flag else None)


if __name__ == "__main__":
    main()
