"""Every registered reward of trl_groupx.rewards trains one real GRPO step on the shipped tiny model, receiving its
dataset columns (one of them None in a row), trainer_state and log_metric from TRL's _calculate_rewards."""

import math

import pytest
from datasets import Dataset

from tests.conftest import build_trainer
from trl_groupx.config import GRPOConfig
from trl_groupx.rewards import REWARD_FUNCS
from trl_groupx.rollouts import make_multi_round_rollout
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import GRPOTrainer


def reward_dataset(n: int = 16) -> Dataset:
    base = arithmetic_dataset(n, seed=0)
    rows = []
    for i, row in enumerate(base):
        rows.append({
            "prompt": row["prompt"],
            "solution": row["answer"] if i != 3 else None,   # one missing gold: the reward gives None → NaN
            "reference": row["answer"],
            "answer": row["answer"],
            "label": row["answer"],
            "forbidden_concepts": ["7"],
            "paraphrase_id": i // 2,
            "language": "LATIN",
        })
    return Dataset.from_list(rows)


# rewards that read the extra fields of one rollout structure: trained with that rollout
ROLLOUTS = {"motif_outcome_reward": lambda: make_multi_round_rollout(num_rounds=2, num_futures=1, max_round_tokens=4)}


@pytest.mark.parametrize("name", sorted(REWARD_FUNCS))
def test_reward_trains_one_step(name, tmp_path):
    rollout = ROLLOUTS[name]() if name in ROLLOUTS else None
    trainer = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, reward_funcs=REWARD_FUNCS[name],
                            dataset=reward_dataset(), report_to="none", rollout_func=rollout)
    trainer.train()
    logs = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    key = f"rewards/{REWARD_FUNCS[name].__name__}/mean"
    assert key in logs and math.isfinite(logs[key]), sorted(logs)
    if name == "curriculum_length_reward":
        assert logs["curriculum_length/budget"] == 256.0  # step 0 of the paper's schedule, via log_metric
