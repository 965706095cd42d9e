"""GAGPO's action-level importance ratio (`importance_sampling_level="turn"`) through the trainer: the counter game
played by the shipped tiny model via TRL 1.16's `rollout_func`, step advantages from `advantage_estimator="gagpo"`,
the ratio in `loss_type="dual_clip"`. Off-policy the turn ratio changes the gradient against the token ratio (and
the loss is the formula on the turns the trainer carried with the rows); on-policy both give the same gradient.
Full and LoRA. A run without a tool mask is one turn per row: the turn ratio is then GSPO's sequence ratio. With
beta > 0 the bias-corrected KL term is weighted by the turn ratio."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.objective_helpers import current_logps, loss_and_grads, off_policy_batch
from trl_groupx.advantages.step_credit import turn_index_from_tool_mask
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective.dual_clip import dual_clip_surrogate
from trl_groupx.objective.kl import per_token_kl
from trl_groupx.objective.surrogates import log_ratio
from trl_groupx.toy.counter_rollout import counter_outcome_reward, make_counter_game_rollout

PEFT = [False, True]


def counter_trainer(path, peft, level):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, path, peft=peft,
                         reward_funcs=counter_outcome_reward, max_completion_length=64,
                         rollout_func=make_counter_game_rollout(), advantage_estimator="gagpo", loss_type="dual_clip",
                         importance_sampling_level=level)


def expected_dual_clip_loss(trainer, inputs, turn_ids):
    """dual_clip at the trainer's ratio level on `inputs`, normalised as `global_token_mean` on one process with no
    accumulation (sum over the loss tokens / the batch's loss-token count); beta = 0, so no KL term."""
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    ctx = ObjectiveContext(current_logps(trainer, inputs), inputs["old_per_token_logps"], inputs["advantages"], mask,
                           turn_ids=turn_ids)
    per_token = dual_clip_surrogate(ctx, epsilon=trainer.args.epsilon, epsilon_high=trainer.args.epsilon_high,
                                    dual_clip_c=trainer.args.dual_clip_c,
                                    importance_sampling_level=trainer.args.importance_sampling_level)
    return (per_token * mask).sum() / inputs["num_items_in_batch"]


@pytest.mark.parametrize("peft", PEFT)
def test_turn_ratio_changes_the_off_policy_gradient(tmp_path, peft):
    turn = counter_trainer(tmp_path / "turn", peft, "turn")
    turn_inputs = off_policy_batch(turn)
    turn_loss, turn_grads = loss_and_grads(turn, turn_inputs)
    token = counter_trainer(tmp_path / "token", peft, "token")
    token_inputs = off_policy_batch(token)
    token_loss, token_grads = loss_and_grads(token, token_inputs)
    assert torch.equal(torch.sort(turn_inputs["completion_ids"], dim=0).values,
                       torch.sort(token_inputs["completion_ids"], dim=0).values)  # same episodes (rows shuffled)
    assert "groupx_turn_ids" not in token_inputs  # only the turn level costs the extra row tensor
    # the turn ids travelled with their rows through TRL's shuffle: they are the turns of each row's own tool mask
    turns = turn_index_from_tool_mask(turn_inputs["tool_mask"], turn_inputs["completion_mask"])
    assert torch.equal(turn_inputs["groupx_turn_ids"], turns)
    assert (turns.max(dim=1).values >= 1).all()  # every episode has at least two turns (the game takes >= 2 moves)
    # the loss is dual-clip PPO on one ratio per turn, shared by the turn's tokens, and differs from the token ratio's
    torch.testing.assert_close(turn_loss, expected_dual_clip_loss(turn, turn_inputs, turns), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(token_loss, expected_dual_clip_loss(token, token_inputs, None), atol=1e-6, rtol=1e-5)
    ctx = ObjectiveContext(current_logps(turn, turn_inputs), turn_inputs["old_per_token_logps"],
                           turn_inputs["advantages"], turn_inputs["completion_mask"] * turn_inputs["tool_mask"],
                           turn_ids=turns)
    on_turns = turns >= 0
    turn_level, token_level = log_ratio(ctx, "turn")[on_turns], log_ratio(ctx, "token")[on_turns]
    assert (turn_level - token_level).abs().max() > 1e-3  # the perturbation moves tokens of one turn differently
    assert grads_differ(turn_grads, token_grads, atol=1e-6)


@pytest.mark.parametrize("peft", PEFT)
def test_turn_ratio_equals_token_ratio_on_policy(tmp_path, peft):
    # ρ = 1 everywhere; every token of a turn carries the turn's step advantage, so the turn's loss -|a| A ρ_a has
    # the gradient -A on each of its tokens, as the token ratio's -A ρ_t
    _, token_grads, _ = one_step(counter_trainer(tmp_path / "token", peft, "token"))
    loss, turn_grads, inputs = one_step(counter_trainer(tmp_path / "turn", peft, "turn"))
    assert torch.isfinite(loss) and "groupx_turn_ids" in inputs
    assert any(g.abs().sum() > 0 for g in turn_grads.values())
    assert turn_grads.keys() == token_grads.keys()
    for k in token_grads:
        torch.testing.assert_close(turn_grads[k], token_grads[k], atol=1e-6, rtol=1e-5)


def test_without_a_tool_mask_the_turn_is_the_sequence(tmp_path):
    # a single-turn run (no rollout_func, no tool mask): one turn per row, so the turn ratio is GSPO's sequence ratio
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, loss_type="dual_clip",
                            importance_sampling_level="turn")
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    mask = inputs["completion_mask"]
    assert torch.equal(inputs["groupx_turn_ids"], torch.where(mask > 0, 0, -1))
    logps = current_logps(trainer, inputs)
    ctx = ObjectiveContext(logps, inputs["old_per_token_logps"], inputs["advantages"].unsqueeze(1), mask)
    seq_ratio = torch.exp(log_ratio(ctx, "sequence"))  # (B, 1), TRL's GSPO ratio
    adv, eps = ctx.advantages, trainer.args.epsilon
    eps_high = eps if trainer.args.epsilon_high is None else trainer.args.epsilon_high
    per_row = torch.maximum(-adv * seq_ratio, -adv * seq_ratio.clamp(1 - eps, 1 + eps_high))
    per_row = torch.where(adv < 0, torch.minimum(per_row, -adv * trainer.args.dual_clip_c), per_row)
    expected = (per_row * mask).sum() / inputs["num_items_in_batch"]
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


def test_bias_corrected_kl_is_weighted_by_the_turn_ratio(tmp_path):
    # beta > 0 with TRL's use_bias_correction_kl (default True): the k3 term is importance-weighted at the run's ratio
    # level, here each token's turn ratio
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=counter_outcome_reward,
                            max_completion_length=64, rollout_func=make_counter_game_rollout(),
                            advantage_estimator="gagpo", loss_type="dual_clip", importance_sampling_level="turn",
                            beta=0.04)
    assert trainer.args.use_bias_correction_kl
    inputs = off_policy_batch(trainer)
    loss, _ = loss_and_grads(trainer, inputs)
    turns = inputs["groupx_turn_ids"]
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    logps = current_logps(trainer, inputs)
    ctx = ObjectiveContext(logps, inputs["old_per_token_logps"], inputs["advantages"], mask, turn_ids=turns)
    k3 = per_token_kl(logps, inputs["ref_per_token_logps"], "k3")
    kl = k3 * torch.exp(log_ratio(ctx, "turn"))
    expected = expected_dual_clip_loss(trainer, inputs, turns) + 0.04 * (kl * mask).sum() / inputs["num_items_in_batch"]
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)
    token_weighted = k3 * torch.exp(log_ratio(ctx, "token"))
    # the turn weight is not the token weight here, by more than the tolerance of the loss check above
    assert 0.04 * ((kl - token_weighted) * mask).sum().abs() / inputs["num_items_in_batch"] > 1e-5
