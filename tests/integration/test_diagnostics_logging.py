"""Per-variant diagnostics go through the Trainer's metrics: the share of tokens a token-weight variant zeroes, and
the share of tokens an objective passes no gradient to (its clip fraction), checked against the formula."""

import torch

from tests.conftest import one_step
from tests.integration.objective_helpers import current_logps, loss_and_grads, off_policy_batch, ours


def test_token_stage_logs_the_masked_fraction(tmp_path):
    trainer = ours(tmp_path, token_weighting="wapo", scale_rewards="none", loss_type="dr_grpo", epsilon_high=9.0)
    _, _, inputs = one_step(trainer)
    fraction = trainer._metrics["train"]["groupx/token_zero_advantage_fraction"][-1]
    # WAPO keeps positive-advantage completions only: every token of a non-positive completion is zero
    rewards = trainer._rewards_per_func[:, 0]
    assert 0.0 < fraction < 1.0 and len(set(rewards.tolist())) > 1


def test_objective_logs_its_clip_fraction(tmp_path):
    trainer = ours(tmp_path, loss_type="balanced_agg")  # PPO's clipped surrogate, eps 0.2
    inputs = off_policy_batch(trainer)
    logps = current_logps(trainer, inputs)
    loss_and_grads(trainer, inputs)
    logged = trainer._metrics["train"]["groupx/zero_gradient_token_fraction"][-1]
    adv = inputs["advantages"].unsqueeze(1).expand_as(logps)
    ratio = torch.exp(logps - inputs["old_per_token_logps"])
    mask = inputs["completion_mask"].bool() & (adv != 0)
    clipped = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    expected = (clipped & mask).sum().item() / mask.sum().item()
    assert expected > 0  # the perturbed policy has moved enough for the clip to act
    assert abs(logged - expected) < 1e-6


def test_on_policy_nothing_is_clipped(tmp_path):
    trainer = ours(tmp_path, loss_type="gmpo")
    one_step(trainer)
    assert trainer._metrics["train"]["groupx/zero_gradient_token_fraction"][-1] == 0.0
