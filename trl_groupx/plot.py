"""`trl-groupx plot RUN [--out DIR] [--keys KEY ...]`: PNG curves from a run's `trainer_state.json`.

`RUN` is a training `output_dir` (its `trainer_state.json`, else the `log_history.json` that `trl-groupx demo`
writes, else the `trainer_state.json` of its latest `checkpoint-*`) or the path of such a file. The Trainer's `log_history` is read;
one PNG per key is written (`<key>.png`, `/` in a key becomes `__`), plus `overview.png` with every selected key.

Default keys (`--keys` not given): `reward`, `loss`, `kl`, `entropy` (those that were logged), the per-function
reward means (`rewards/<name>/mean`), trl_groupx's own diagnostics (`groupx/...`, e.g. `groupx/advantage_abs_mean`,
`groupx/kept_fraction`) and every key naming a registered variant id (e.g. `gtpo_conflict/masked_fraction`).
`--keys` takes logged key names or shell-style patterns (`clip_ratio/*`); a key or pattern that matches nothing is an
error that lists the logged keys. Rendering uses matplotlib's Agg canvas (no display, no global backend change).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

DEFAULT_KEYS = ("reward", "loss", "kl", "entropy")
_NOT_CURVES = {"step", "epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
               "train_loss"}


def find_trainer_state(run: str | Path) -> Path:
    """`trainer_state.json` of a run folder (or of its latest checkpoint), or `run` itself if it is that file."""
    run = Path(run)
    if run.is_file():
        return run
    if not run.exists():
        raise FileNotFoundError(f"{run}: no such output_dir or trainer_state.json.")
    if (run / "trainer_state.json").is_file():
        return run / "trainer_state.json"
    if (run / "log_history.json").is_file():  # what `trl-groupx demo` writes
        return run / "log_history.json"
    checkpoints = sorted(
        (p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
        key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1,
    )
    if not checkpoints:
        raise FileNotFoundError(f"{run}: no trainer_state.json in it or in a checkpoint-* folder (the Trainer writes "
                                "one with every checkpoint; save with save_strategy or call trainer.save_state()).")
    return checkpoints[-1] / "trainer_state.json"


def load_log_history(path: str | Path) -> list[dict[str, Any]]:
    state_path = find_trainer_state(path)
    try:
        state = json.loads(state_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{state_path}: not valid JSON ({err}).") from None
    history = state.get("log_history") if isinstance(state, dict) else state  # a bare list: the demo's file
    if not isinstance(history, list):
        raise ValueError(f"{state_path}: no log_history list; is this a Trainer's trainer_state.json?")
    return [entry for entry in history if isinstance(entry, dict)]


def logged_keys(history: list[dict[str, Any]]) -> list[str]:
    """Keys with at least one numeric value in the log history (bookkeeping keys left out)."""
    keys = {
        key
        for entry in history
        for key, value in entry.items()
        if key not in _NOT_CURVES and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return sorted(keys)


def _variant_ids() -> list[str]:
    from .registry import list_variants

    return [v.id for v in list_variants()]


def _names_variant(key: str, ids: list[str]) -> bool:
    return any(re.search(rf"(^|[^a-z0-9]){re.escape(vid)}($|[^a-z0-9])", key) for vid in ids)


def select_keys(history: list[dict[str, Any]], keys: list[str] | None = None) -> list[str]:
    """The keys to plot: the requested ones (names or patterns; each must match a logged key) or the defaults."""
    available = logged_keys(history)
    if not available:
        raise ValueError("the log history has no numeric values to plot (did the run log anything? logging_steps).")
    if keys:
        selected: list[str] = []
        missing = []
        for key in keys:
            matches = fnmatch.filter(available, key) if any(c in key for c in "*?[") else \
                [key] if key in available else []
            if not matches:
                missing.append(key)
            selected += [m for m in matches if m not in selected]
        if missing:
            raise ValueError(f"unknown key(s) {missing}: not in the log history. Logged keys: {available}.")
        return selected
    ids = _variant_ids()
    selected = [k for k in DEFAULT_KEYS if k in available]
    selected += [
        k for k in available
        if k not in selected and (k.startswith("groupx/") or (k.startswith("rewards/") and k.endswith("/mean"))
                                  or _names_variant(k, ids))
    ]
    if not selected:
        raise ValueError(f"none of the default keys were logged; pick some with --keys from: {available}.")
    return selected


def curve(history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`; entries without a step use their index; non-finite values are skipped."""
    xs, ys = [], []
    for i, entry in enumerate(history):
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(float(entry.get("step", i)))
            ys.append(float(value))
    return xs, ys


def _file_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key.replace("/", "__")) + ".png"


def plot_run(run: str | Path, out: str | Path | None = None, keys: list[str] | None = None) -> list[Path]:
    """Write one PNG per selected key and `overview.png` into `out` (default: `<run folder>/plots`); returns paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    state_path = find_trainer_state(run)
    history = load_log_history(state_path)
    selected = select_keys(history, keys)
    out = Path(out) if out is not None else state_path.parent / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key in selected:
        fig = Figure(figsize=(6, 3.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        xs, ys = curve(history, key)
        ax.plot(xs, ys, marker="." if len(xs) < 50 else None)
        ax.set(title=key, xlabel="step", ylabel=key)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / _file_name(key)
        fig.savefig(path)
        written.append(path)
    cols = min(3, len(selected))
    rows = math.ceil(len(selected) / cols)
    fig = Figure(figsize=(4.5 * cols, 3 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for i, key in enumerate(selected):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.plot(*curve(history, key))
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "overview.png")
    written.append(out / "overview.png")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="trl-groupx plot", description="PNG curves from a run's trainer_state.json.")
    parser.add_argument("run", help="training output_dir, checkpoint folder or trainer_state.json")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: <run>/plots)")
    parser.add_argument("--keys", nargs="+", default=None,
                        help="logged keys or patterns to plot (default: reward, loss, kl, entropy, groupx/*, "
                             "rewards/*/mean and keys naming a variant)")
    parser.add_argument("--list", action="store_true", help="print the logged keys and exit")
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if ns.list:
            print("\n".join(logged_keys(load_log_history(ns.run))))
            return
        paths = plot_run(ns.run, ns.out, ns.keys)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    print("\n".join(str(p) for p in paths))
