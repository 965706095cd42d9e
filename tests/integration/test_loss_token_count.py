"""TRL's `num_items_in_batch` (the normaliser of token-mean losses) counts loss tokens: completion mask times the tool
mask of multi-turn rollouts. Stages that mask rollouts out recount it the same way, so a multi-turn run with a
sampling filter (or MC-GRPO's pivot) normalises by the tokens it trains on, not by the tool tokens too."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, one_step
from trl_groupx.toy.counter_rollout import counter_outcome_reward, make_counter_game_rollout


def _multi_turn(tmp_path, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=counter_outcome_reward,
                         max_completion_length=64, rollout_func=make_counter_game_rollout(), **flags)


@pytest.mark.parametrize("flags", [{}, {"rollout_filter": "gfpo", "gfpo_keep": 2},
                                   {"advantage_estimator": "mc_grpo", "num_generations": 5,
                                    "per_device_train_batch_size": 10}], ids=["plain", "gfpo", "mc_grpo"])
def test_num_items_counts_loss_tokens_after_the_stages(tmp_path, flags):
    _, _, inputs = one_step(_multi_turn(tmp_path, **flags))
    assert "tool_mask" in inputs and (inputs["tool_mask"] == 0).any()  # the toy's turns are separated by tool text
    loss_tokens = (inputs["completion_mask"] * inputs["tool_mask"]).sum()
    assert loss_tokens < inputs["completion_mask"].sum()
    torch.testing.assert_close(inputs["num_items_in_batch"].to(loss_tokens), loss_tokens)
