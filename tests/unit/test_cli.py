"""The command line: `list` shows the registry, `demo` trains and plots, `grpo` is reachable."""

import pytest

import trl_groupx
from trl_groupx.cli import format_variants, main


def test_list_shows_every_variant_with_its_fields(capsys):
    main(["list"])
    out = capsys.readouterr().out
    for v in trl_groupx.list_variants():
        assert f"{v.id}  [{v.stage}]" in out
        assert v.paper in out
    assert "loss_type='gmpo', gmpo_clip=0.4" in out
    assert "callsys/GMPO@205b2bf412f150cf96c29b33273b81bcd1a9b20f" in out


def test_list_by_stage():
    text = format_variants("objective")
    assert "gmpo  [objective]" in text and "[advantages]" not in text


def test_unknown_command_exits():
    with pytest.raises(SystemExit):
        main(["frobnicate"])


@pytest.mark.slow
def test_demo_trains_and_writes_the_curve(tmp_path, capsys):
    main(["demo", "--steps", "3", "--output-dir", str(tmp_path), "--flag", "advantage_estimator=sign_adv"])
    out = capsys.readouterr().out
    assert out.count("step ") >= 3 and "mean reward" in out
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000
    assert (tmp_path / "log_history.json").exists()


def test_demo_flag_parsing():
    from trl_groupx.demo import parse_flags

    assert parse_flags(["loss_type=gmpo", "gmpo_clip=0.3", "beta=0"]) == {"loss_type": "gmpo", "gmpo_clip": 0.3, "beta": 0}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        parse_flags(["loss_type"])


def test_bench_runs_a_benchmark_and_rejects_unknown_names(capsys):
    main(["bench", "throughput", "--rollouts", "64", "--group-sizes", "4", "--repeats", "1"])
    assert "per-group Python loop" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="usage: trl-groupx bench"):
        main(["bench", "nope"])
