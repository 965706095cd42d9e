"""`generation_temperatures` (MDP-GRPO's per-completion temperatures): config checks and the row → temperature
map (completion index = global row mod G)."""

import math

import pytest

from trl_groupx import GRPOConfig
from trl_groupx.sampling.temperatures import row_temperatures


def config(**flags):
    return GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **flags)


def test_row_temperatures_follow_the_completion_index():
    temps = [0.1, 0.4, 0.7, 1.0]
    assert row_temperatures(temps, 0, 8) == [0.1, 0.4, 0.7, 1.0, 0.1, 0.4, 0.7, 1.0]
    # a process whose slice starts at global row 6 (mid-group): completions 2, 3, then the next group
    assert row_temperatures(temps, 6, 4) == [0.7, 1.0, 0.1, 0.4]


def test_good_config():
    c = config(num_generations=4, generation_temperatures=[0.1, 0.4, 0.7, 1.0])
    assert c.generation_temperatures == [0.1, 0.4, 0.7, 1.0]


@pytest.mark.parametrize(
    "flags, match",
    [
        (dict(num_generations=4, generation_temperatures=[0.1, 0.4, 1.0]), "3 temperatures but num_generations=4"),
        (dict(num_generations=2, generation_temperatures=[0.0, 1.0]), "positive temperatures"),
        (dict(num_generations=2, generation_temperatures=[math.nan, 1.0]), "positive temperatures"),
        (dict(num_generations=2, generation_temperatures=[]), "positive temperatures"),
        (dict(num_generations=2, generation_temperatures=[0.5, 1.0], use_vllm=True), "use_vllm=False"),
    ],
)
def test_bad_config(flags, match):
    with pytest.raises(ValueError, match=match):
        config(**flags)
