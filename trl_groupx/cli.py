"""`trl-groupx` command line: `list` the variants, run the `demo`, train from a recipe with `grpo`, `plan` memory,
share recipes, `plot` a run, `bench` against plain TRL."""

from __future__ import annotations

import argparse
import sys

from .registry import list_variants


def format_variants(stage: str | None = None) -> str:
    """The registry as text, one block per variant: id, stage, paper; then its flags and official code."""
    blocks = []
    for v in list_variants(stage):
        origin = "  (TRL built-in preset)" if v.native else ""
        flags = ", ".join(f"{key}={value!r}" for key, value in v.flags.items())
        lines = [f"{v.id}  [{v.stage}]{origin}", f"    paper: {v.paper}", f"    flags: {flags}"]
        lines.append(f"    code:  {v.official_code or '-'}")
        if v.needs:
            lines.append(f"    needs: {', '.join(v.needs)}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


BENCHMARKS = {"overhead": "overhead", "throughput": "advantage_throughput", "curves": "learning_curves"}


def run_benchmark(argv: list[str]) -> None:
    """`trl-groupx bench NAME [args]`: run `benchmarks/<script>.py` of the source checkout with `args`."""
    import importlib.util
    from pathlib import Path

    if not argv or argv[0] not in BENCHMARKS:
        raise SystemExit(f"usage: trl-groupx bench {{{','.join(BENCHMARKS)}}} [args] (see benchmarks/README.md)")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{BENCHMARKS[argv[0]]}.py"
    if not path.exists():
        raise SystemExit(
            f"{path} not found: the benchmarks ship with the source repository (they reuse its test helpers); "
            "clone it and install with `pip install -e .` to run them."
        )
    spec = importlib.util.spec_from_file_location(f"trl_groupx_bench_{argv[0]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv[1:])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="trl-groupx", description="GRPO variants as config flags on TRL.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="show every registered variant")
    p_list.add_argument("--stage", choices=["sampling", "advantages", "token_weights", "objective"])
    sub.add_parser("demo", help="train the shipped tiny model with a variant (CPU, offline)", add_help=False)
    sub.add_parser("grpo", help="train from a recipe: grpo --config recipes/gmpo.yaml [--field value ...]",
                   add_help=False)
    sub.add_parser("plan", help="peak GPU memory of a GRPO run and how to make it fit", add_help=False)
    if argv and argv[0] == "plan":  # parses its own arguments
        from .memory.cli import main as plan_main

        plan_main(argv[1:])
        return
    sub.add_parser("recipe", help="recipe push/pull/check: share recipes via the Hub, a folder or git", add_help=False)
    sub.add_parser("plot", help="PNG curves of a run's trainer_state.json log history", add_help=False)
    if argv and argv[0] in ("recipe", "plot"):  # parse their own arguments (trl_groupx/hub.py, trl_groupx/plot.py)
        if argv[0] == "recipe":
            from .hub import main as sub_main
        else:
            from .plot import main as sub_main
        sub_main(argv[1:])
        return
    sub.add_parser("bench", help="benchmarks against plain TRL: bench overhead|throughput|curves [args]",
                   add_help=False)
    if argv and argv[0] == "bench":
        run_benchmark(argv[1:])
        return
    if argv and argv[0] in ("demo", "grpo"):  # these parse their own arguments
        if argv[0] == "demo":
            from .demo import main as sub_main
        else:
            from .script import main as sub_main
        sub_main(argv[1:])
        return
    ns = parser.parse_args(argv)
    if ns.command == "list":
        print(format_variants(ns.stage))
        if ns.stage is None:  # rollout structures (recipe `rollout:`) are not stage variants
            from .rollouts import format_rollouts

            print(format_rollouts())


if __name__ == "__main__":
    main()
