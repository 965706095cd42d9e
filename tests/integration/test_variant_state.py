"""Stateful variants: the state a variant keeps is saved with each checkpoint and a resumed run continues exactly."""

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer
from trl_groupx.registry import register, scoped_variants
from trl_groupx.trainer import VARIANT_STATE_NAME


def running_baseline(rewards: torch.Tensor, group_size: int, *, state: dict) -> torch.Tensor:
    """Test-only stateful estimator: A = r - b, with b an exponential moving average of past batch means."""
    baseline = state.get("baseline", torch.tensor(0.0))
    advantages = torch.nan_to_num(rewards - baseline)
    state["baseline"] = 0.5 * baseline + 0.5 * torch.nanmean(rewards)
    state["calls"] = state.get("calls", 0) + 1
    return advantages


@pytest.fixture
def stateful_variant():
    with scoped_variants():
        register("test_running_baseline", name="t", paper="arXiv:0000.00000", official_code=None,
                 stage="advantages", stateful=True)(running_baseline)
        yield


def _trainer(path, **overrides):
    settings = dict(advantage_estimator="test_running_baseline", max_steps=3, save_strategy="steps", save_steps=1)
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, path, **{**settings, **overrides})


def test_state_is_saved_and_resume_continues_exactly(tmp_path, stateful_variant):
    full = _trainer(tmp_path / "full")
    full.train()
    assert full.variant_state["test_running_baseline"]["calls"] == 3
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert saved["test_running_baseline"]["calls"] == 2

    resumed = _trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    a, b = full.variant_state["test_running_baseline"], resumed.variant_state["test_running_baseline"]
    assert a["calls"] == b["calls"] == 3
    assert torch.equal(a["baseline"], b["baseline"])
    assert_same_weights(full, resumed)


def test_resuming_from_a_checkpoint_without_state_is_an_error(tmp_path, stateful_variant):
    plain = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "plain", max_steps=1,
                          save_strategy="steps", save_steps=1)
    plain.train()
    with pytest.raises(FileNotFoundError, match="stateful variants.*test_running_baseline"):
        _trainer(tmp_path / "r").train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-1"))


def test_stateful_flag_must_match_signature():
    with scoped_variants(), pytest.raises(ValueError, match="stateful=False but its fn has a `state` argument"):
        register("bad_state", name="t", paper="arXiv:0000.00000", official_code=None, stage="advantages")(
            running_baseline)


def test_evaluation_does_not_advance_state(tmp_path, stateful_variant):
    trainer = _trainer(tmp_path, max_steps=1)
    trainer.train()
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in trainer.variant_state["test_running_baseline"].items()}
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)  # the eval path runs the stages too
    after = trainer.variant_state["test_running_baseline"]
    assert after["calls"] == before["calls"] == 1
    assert torch.equal(after["baseline"], before["baseline"])
