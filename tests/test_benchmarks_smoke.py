"""Keeps the benchmark scripts working (tiny sizes; no timing is asserted)."""

import importlib.util
import json
from pathlib import Path

import pytest

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


def test_learning_curves_writes_results(tmp_path):
    results = _load("learning_curves").main(
        ["--steps", "2", "--seeds", "1", "--configs", "sign_adv", "--output-dir", str(tmp_path)]
    )
    assert len(results["sign_adv"]["runs"][0]["rewards"]) == 2
    for name in ("learning_curves.md", "learning_curves.json", "learning_curves.png", "learning_curves_small_groups.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| sign_adv |" in (tmp_path / "learning_curves.md").read_text()


def test_learning_curves_merge_keeps_the_report_and_refuses_another_step_count(tmp_path):
    curves = _load("learning_curves")
    curves.main(["--steps", "2", "--seeds", "1", "--configs", "sign_adv", "--output-dir", str(tmp_path)])
    results = curves.main(["--steps", "2", "--seeds", "1", "--merge", "--configs", "rloo", "--output-dir", str(tmp_path)])
    assert list(results) == ["sign_adv", "rloo"]  # the list's order, the earlier run kept
    report = (tmp_path / "learning_curves.md").read_text()
    assert "| sign_adv |" in report and "| rloo |" in report
    assert (tmp_path / "learning_curves_families.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="steps=2"):
        curves.main(["--steps", "3", "--seeds", "1", "--merge", "--output-dir", str(tmp_path)])


def test_learning_curves_mixed_task_reports_easy_and_hard(tmp_path):
    results = _load("learning_curves").main(
        ["--task", "mixed", "--steps", "2", "--seeds", "1", "--configs", "focal_tailmiss", "--output-dir", str(tmp_path)]
    )
    run = results["focal_tailmiss"]["runs"][0]
    assert {"pass@1 easy", "pass@1 hard", "pass@8 hard"} <= run.keys()
    report = (tmp_path / "learning_curves_mixed.md").read_text()
    assert "| focal_tailmiss |" in report and "pass@1 hard" in report
    assert (tmp_path / "learning_curves_mixed.png").stat().st_size > 0


def test_chunked_logps_benchmark_writes_a_ratio_table(tmp_path):
    out = tmp_path / "chunked_logps.md"
    rows = _load("chunked_logps").main(
        ["--vocab", "2000", "--prompt-len", "8", "--completion-len", "8", "--batch", "4", "--chunks", "4",
         "--in-process", "--output", str(out)]
    )
    assert [r["case"] for r in rows] == ["trl", "chunk=4", "full logits"]
    assert "| chunk=4 |" in out.read_text()


def test_overhead_cases_cover_the_registry(tmp_path):
    overhead = _load("overhead")
    assert set(overhead.registry_cases()) == ({"no flag"} | {v.id for v in trl_groupx.list_variants()}
                                              | set(overhead.MODE_CASES))
    assert all(overhead.variant_id(name) in overhead.registry_cases() for name in overhead.MODE_CASES)
    results = overhead.main(["--steps", "1", "--cases", "sign_adv", "--output-dir", str(tmp_path)])
    assert results["sign_adv"]["median_ratio"] > 0
    assert "| sign_adv |" in (tmp_path / "overhead.md").read_text()


def test_overhead_missing_adds_only_absent_rows(tmp_path):
    overhead = _load("overhead")
    known = {name: {"median_ratio": 1.5, "steps": 3, "flags": flags}
             for name, flags in overhead.registry_cases().items() if name != "sign_adv"}
    (tmp_path / "overhead.json").write_text(json.dumps(known))
    (tmp_path / "overhead.md").write_text("# old\n\n| case | median ratio | what it adds |\n|---|---|---|\n\nA note.\n")
    results = overhead.main(["--steps", "1", "--missing", "--output-dir", str(tmp_path)])
    assert list(results) == ["sign_adv"]  # only the absent case ran
    merged = json.loads((tmp_path / "overhead.json").read_text())
    assert merged.keys() == overhead.registry_cases().keys() and merged["gmpo"]["median_ratio"] == 1.5
    report = (tmp_path / "overhead.md").read_text()
    assert "| gmpo | 1.500 |" in report and "| sign_adv |" in report and report.rstrip().endswith("A note.")


def test_committed_overhead_table_has_every_variant():
    """Rows are added with `overhead.py --missing --output-dir benchmarks/results` when a variant lands."""
    rows = json.loads((BENCH / "results" / "overhead.json").read_text())
    missing = sorted({v.id for v in trl_groupx.list_variants()} - set(rows))
    assert not missing, f"run: python benchmarks/overhead.py --steps 15 --missing --output-dir benchmarks/results ({missing})"


def test_gpu_memory_check_dry_run(tmp_path):
    spec = importlib.util.spec_from_file_location("memory_check", BENCH / "gpu" / "memory_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--cpu-dry-run", "--output", str(tmp_path / "gpu.md")])
    assert len(results) == 2 and all(r["plan"].train_peak > 0 for r in results)
    assert "| tiny | 4 | 4 | 8 | 8 | on |" in (tmp_path / "gpu.md").read_text()


def test_prefix_grouper_benchmark_writes_a_ratio_table(tmp_path):
    out = tmp_path / "prefix_grouper.md"
    rows = _load("prefix_grouper").main(
        ["--prompt-len", "16", "--completion-len", "4", "--hidden", "32", "--layers", "1", "--repeats", "1",
         "--rounds", "1", "--in-process", "--output", str(out)]
    )
    assert [r["case"] for r in rows] == ["trl", "prefix_grouper"]
    assert abs(rows[0]["loss"] - rows[1]["loss"]) < 1e-5  # same computation
    assert "| prefix_grouper |" in out.read_text()
