"""Bad reward functions fail at construction or at the first step with the function's name, on TRL's own path (no
flag) and with a variant; TRL's own numbers are unchanged by the check (the parity suite covers that)."""

import pytest

from tests.conftest import one_step
from tests.integration.objective_helpers import ours
from trl_groupx.toy import arithmetic_dataset


def inf_reward(completions, **kwargs):
    return [float("inf")] + [0.0] * (len(completions) - 1)


def text_reward(completions, **kwargs):
    return ["1"] * len(completions)


def raising_reward(completions, **kwargs):
    raise ZeroDivisionError("division by zero")


def needs_solution(completions, solution, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize("flags", [{}, {"advantage_estimator": "sign_adv"}, {"loss_type": "gmpo"}])
@pytest.mark.parametrize(
    "reward, error, match",
    [
        (inf_reward, ValueError, "reward function 'inf_reward' returned inf for completion 0"),
        (text_reward, ValueError, "reward function 'text_reward' returned '1'"),
        (raising_reward, RuntimeError, "reward function 'raising_reward' raised ZeroDivisionError"),
    ],
)
def test_bad_rewards_fail_at_the_first_step(tmp_path, flags, reward, error, match):
    trainer = ours(tmp_path, reward_funcs=reward, **flags)
    with pytest.raises(error, match=match):
        one_step(trainer)


def test_missing_column_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"'needs_solution' needs the dataset column\(s\) \['solution'\]"):
        ours(tmp_path, reward_funcs=needs_solution, dataset=arithmetic_dataset(16))
