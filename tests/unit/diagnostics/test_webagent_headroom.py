"""webagent_headroom: sampled-minus-greedy success; near-zero temperature makes sampled == greedy (headroom 0)."""

import pytest

from tests.conftest import build_trainer
from trl_groupx.config import GRPOConfig
from trl_groupx.diagnostics import HeadroomProbe, measure_headroom
from trl_groupx.toy import arithmetic_dataset, arithmetic_reward, load_tiny_model, load_tiny_tokenizer
from trl_groupx.trainer import GRPOTrainer

ROWS = list(arithmetic_dataset(8, seed=1))


def test_zero_temperature_limit_gives_zero_headroom():
    model, tok = load_tiny_model(), load_tiny_tokenizer()
    out = measure_headroom(model, tok, ROWS, arithmetic_reward, num_samples=4, temperature=1e-6, max_new_tokens=6)
    assert out["sampled_success"] == out["greedy_success"] and out["headroom"] == 0.0


def test_values_in_range_and_consistent():
    model, tok = load_tiny_model(), load_tiny_tokenizer()
    out = measure_headroom(model, tok, ROWS, arithmetic_reward, num_samples=4, temperature=1.0, max_new_tokens=6)
    assert 0.0 <= out["greedy_success"] <= 1.0 and 0.0 <= out["sampled_success"] <= 1.0
    assert out["headroom"] == pytest.approx(out["sampled_success"] - out["greedy_success"])
    # the shipped model is greedy-correct and flattened for sampling: sampling does worse (negative headroom)
    assert out["headroom"] < 0
    with pytest.raises(ValueError):
        measure_headroom(model, tok, ROWS, arithmetic_reward, temperature=0.0)


def test_callback_logs_once_before_training(tmp_path):
    trainer = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, reward_funcs=arithmetic_reward,
                            dataset=arithmetic_dataset(32, seed=0), max_steps=2)
    probe = HeadroomProbe(ROWS[:4], arithmetic_reward, num_samples=2)
    trainer.add_callback(probe.bind(trainer))
    trainer.train()
    logged = [e for e in trainer.state.log_history if "headroom/headroom" in e]
    assert len(logged) == 1 and logged[0]["headroom/headroom"] == pytest.approx(probe.metrics["headroom/headroom"])
    with pytest.raises(ValueError):
        HeadroomProbe([], arithmetic_reward)
