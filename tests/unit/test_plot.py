"""`trl-groupx plot`: PNG curves from a synthetic trainer_state.json; unknown keys give a clear error."""

import json

import pytest

from trl_groupx.cli import main
from trl_groupx.plot import find_trainer_state, logged_keys, plot_run, select_keys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _history(steps: int = 5) -> list[dict]:
    history = []
    for s in range(1, steps + 1):
        history.append({
            "step": s, "epoch": s / steps, "loss": 1.0 / s, "reward": 0.1 * s, "reward_std": 0.3, "kl": 0.01 * s,
            "entropy": 2.0 - 0.1 * s, "rewards/parity_reward/mean": 0.1 * s, "clip_ratio/low_mean": 0.0,
            "groupx/advantage_abs_mean": 0.5, "groupx/kept_fraction": 0.75,
            "gtpo_conflict/masked_fraction": 0.2,  # a key naming a registered variant id
            "learning_rate": 1e-5,
        })
    history.append({"step": steps, "train_runtime": 12.0, "train_loss": 0.4, "total_flos": 0.0})  # end-of-train entry
    return history


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 5, "log_history": _history()}))
    return run


def test_default_keys_cover_reward_loss_kl_entropy_groupx_and_variant_keys(run_dir):
    from trl_groupx.plot import load_log_history

    history = load_log_history(run_dir)
    selected = select_keys(history)
    assert selected[:4] == ["reward", "loss", "kl", "entropy"]
    for key in ("groupx/advantage_abs_mean", "groupx/kept_fraction", "gtpo_conflict/masked_fraction",
                "rewards/parity_reward/mean"):
        assert key in selected
    assert "learning_rate" not in selected and "reward_std" not in selected  # logged, but not a default
    assert "train_runtime" not in logged_keys(history) and "step" not in logged_keys(history)


def test_plot_writes_pngs_for_the_defaults(run_dir, tmp_path, capsys):
    out = tmp_path / "plots"
    main(["plot", str(run_dir), "--out", str(out)])
    printed = capsys.readouterr().out.split()
    for name in ("reward.png", "loss.png", "kl.png", "entropy.png", "groupx__advantage_abs_mean.png",
                 "gtpo_conflict__masked_fraction.png", "overview.png"):
        path = out / name
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 1000, name
        assert str(path) in printed


def test_explicit_keys_and_patterns(run_dir, tmp_path):
    paths = plot_run(run_dir / "trainer_state.json", tmp_path / "p", ["reward_std", "clip_ratio/*"])
    assert [p.name for p in paths] == ["reward_std.png", "clip_ratio__low_mean.png", "overview.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)


def test_unknown_key_is_a_clear_error(run_dir, tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['rewrad'\].*Logged keys: .*'reward'"):
        plot_run(run_dir, tmp_path / "p", ["reward", "rewrad"])
    with pytest.raises(SystemExit, match=r"unknown key\(s\) \['nope/\*'\]"):
        main(["plot", str(run_dir), "--keys", "nope/*"])
    assert not (tmp_path / "p").exists()  # nothing written on error


def test_default_out_dir_and_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    for step in (2, 10):  # checkpoint-10 is the latest, though it sorts before checkpoint-2 as text
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"log_history": _history(step)}))
    assert find_trainer_state(run) == run / "checkpoint-10" / "trainer_state.json"
    paths = plot_run(run, keys=["loss"])
    assert paths[0] == run / "checkpoint-10" / "plots" / "loss.png" and paths[0].exists()


def test_missing_or_bad_state_files(tmp_path, capsys):
    with pytest.raises(SystemExit, match="no trainer_state.json"):
        main(["plot", str(tmp_path)])
    with pytest.raises(SystemExit, match="no such output_dir"):
        main(["plot", str(tmp_path / "absent")])
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1}]}))
    with pytest.raises(SystemExit, match="no numeric values"):
        main(["plot", str(tmp_path)])
    (tmp_path / "trainer_state.json").write_text("{not json")
    with pytest.raises(SystemExit, match="not valid JSON"):
        main(["plot", str(tmp_path)])


def test_list_prints_logged_keys(run_dir, capsys):
    main(["plot", str(run_dir), "--list"])
    out = capsys.readouterr().out.split()
    assert "reward" in out and "groupx/kept_fraction" in out and "step" not in out


def test_demo_log_history_file(tmp_path):
    (tmp_path / "log_history.json").write_text(json.dumps(_history()))  # `trl-groupx demo` writes a bare list
    paths = plot_run(tmp_path, keys=["reward"])
    assert paths[0] == tmp_path / "plots" / "reward.png" and paths[0].read_bytes()[:8] == PNG_MAGIC
