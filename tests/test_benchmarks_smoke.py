"""Keeps the benchmark scripts working (tiny sizes; no timing is asserted)."""

import importlib.util
from pathlib import Path

import trl_groupx

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_advantage_throughput_covers_every_estimator(capsys):
    _load("advantage_throughput").main(["--rollouts", "64", "--group-sizes", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    for variant in trl_groupx.list_variants("advantages"):
        assert f"\n{variant.id} " in out
    assert "per-group Python loop" in out


def test_overhead_runs_two_steps(capsys):
    _load("overhead").main(["--steps", "2", "--cases", "no flag", "gmpo"])
    out = capsys.readouterr().out
    assert "no flag" in out and "gmpo" in out
