"""N-GRPO on the tiny model through the trainer: mix_rate 0 is plain GRPO (same rollouts, same gradient), mixing
changes the rollouts and the gradient (full and LoRA), every log-prob forward replays the mixed inputs (old,
reference, loss), evaluation does not mix, composition with GMPO and with chunked log-probs, and construction
refusals."""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.sampling.neighbor_mixing import IDS_KEY, WEIGHTS_KEY, set_loss_replay
from trl_groupx.toy.counter_rollout import make_counter_game_rollout


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, max_completion_length=8,
                         **flags)


def _logps(trainer, inputs, replay: bool):
    """The trainer's log-probs of `inputs`' completions, with or without their mixing records."""
    set_loss_replay(trainer, inputs if replay else {})
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask,
                                                                 inputs["completion_ids"].size(1))
    return logps


@pytest.mark.parametrize("peft", [False, True])
def test_mix_rate_zero_is_grpo_and_mixing_changes_the_gradient(tmp_path, peft):
    _, g_plain, in_plain = one_step(ours(tmp_path / "plain", peft))
    _, g_zero, in_zero = one_step(ours(tmp_path / "zero", peft, rollout_filter="n_grpo", n_grpo_mix_rate=0.0))
    assert torch.equal(in_plain["completion_ids"], in_zero["completion_ids"])  # the same seeded rollouts
    assert not grads_differ(g_plain, g_zero, atol=0)  # and the same gradient, bit for bit
    assert in_zero[WEIGHTS_KEY].abs().sum() == 0
    mixing = ours(tmp_path / "mix", peft, rollout_filter="n_grpo", n_grpo_mix_rate=0.5, n_grpo_top_k=3)
    loss, g_mix, in_mix = one_step(mixing)
    assert not torch.equal(in_plain["completion_ids"], in_mix["completion_ids"])  # later tokens see other inputs
    assert torch.isfinite(loss) and grads_differ(g_plain, g_mix)
    mixed = in_mix[WEIGHTS_KEY].sum(-1) > 0
    assert mixed.any() and not (mixed & ~in_mix["completion_mask"].bool()).any()  # only real tokens carry a mix
    assert in_mix[IDS_KEY].shape == (*in_mix["completion_ids"].shape, 3)
    assert 0 < mixing._metrics["train"]["n_grpo/mixed_token_fraction"][0] < 1


def test_the_loss_forward_replays_the_mixed_inputs(tmp_path):
    trainer = ours(tmp_path, rollout_filter="n_grpo", n_grpo_mix_rate=1.0, n_grpo_think_end=None)
    _, _, inputs = one_step(trainer)
    mixed = _logps(trainer, inputs, replay=True)
    plain = _logps(trainer, inputs, replay=False)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(mixed[:, 0], plain[:, 0])  # the first token's inputs are the prompt's
    assert not torch.allclose(mixed[:, 1:][mask[:, 1:]], plain[:, 1:][mask[:, 1:]], atol=1e-4)
    # the records are the rows' own: shuffled with them, the loss's log-probs follow the rows
    order = torch.arange(inputs["completion_ids"].size(0)).flip(0)
    flipped = {k: v[order] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in inputs.items()}
    torch.testing.assert_close(_logps(trainer, flipped, replay=True), mixed[order])


def test_old_and_reference_log_probs_are_computed_on_the_mixed_inputs(tmp_path):
    # steps_per_generation 2 with one accumulation step: TRL computes the old log-probs at generation; beta > 0 and
    # LoRA: the reference is the base model, forwarded on the same mixed inputs
    trainer = ours(tmp_path, True, rollout_filter="n_grpo", n_grpo_mix_rate=1.0, steps_per_generation=2, beta=0.1)
    _, _, inputs = one_step(trainer)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(inputs["old_per_token_logps"][mask], _logps(trainer, inputs, replay=True)[mask])
    assert not torch.allclose(inputs["old_per_token_logps"][mask], _logps(trainer, inputs, replay=False)[mask],
                              atol=1e-4)
    with trainer.model.disable_adapter():
        ref = _logps(trainer, inputs, replay=True)
    torch.testing.assert_close(inputs["ref_per_token_logps"][mask], ref[mask])


def test_evaluation_does_not_mix(tmp_path):
    trainer = ours(tmp_path, rollout_filter="n_grpo", n_grpo_mix_rate=1.0)
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    output = trainer._generate_and_score_completions(batch)
    assert IDS_KEY not in output and trainer._n_grpo_replay is None
    plain = ours(tmp_path / "plain")
    plain.model.eval()
    torch.manual_seed(0)
    assert torch.equal(plain._generate_and_score_completions(batch)["completion_ids"], output["completion_ids"])


def test_composes_with_gmpo(tmp_path):
    flags = dict(loss_type="gmpo", rollout_filter="n_grpo", n_grpo_mix_rate=0.5)
    _, g_gmpo, _ = one_step(ours(tmp_path / "gmpo", loss_type="gmpo"))
    loss, grads, inputs = one_step(ours(tmp_path / "both", **flags))
    assert torch.isfinite(loss) and (inputs[WEIGHTS_KEY].sum(-1) > 0).any()
    assert grads_differ(g_gmpo, grads)


def test_a_rollout_func_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="rollout_filter='n_grpo' feeds mixed embeddings inside TRL's own"):
        ours(tmp_path, rollout_filter="n_grpo", rollout_func=make_counter_game_rollout())


def test_chunked_log_probs_replay_the_same_inputs(tmp_path):
    flags = dict(rollout_filter="n_grpo", n_grpo_mix_rate=1.0, steps_per_generation=2)
    loss, grads, inputs = one_step(ours(tmp_path / "whole", **flags))
    loss_c, grads_c, inputs_c = one_step(ours(tmp_path / "chunked", logps_chunk_size=3, **flags))
    assert torch.equal(inputs["completion_ids"], inputs_c["completion_ids"])
    torch.testing.assert_close(inputs_c["old_per_token_logps"], inputs["old_per_token_logps"], atol=1e-5, rtol=0)
    torch.testing.assert_close(loss_c, loss)
    assert not grads_differ(grads, grads_c, atol=1e-6)


def test_pairs_and_nan_rewards(tmp_path):
    def reward(completions, **kwargs):  # pairs (NaN, 1), (0, 1), (1, 0), (NaN, 0)
        return [math.nan, 1.0, 0.0, 1.0, 1.0, 0.0, math.nan, 0.0]

    trainer = ours(tmp_path, rollout_filter="n_grpo", n_grpo_mix_rate=0.5, num_generations=2, reward_funcs=reward)
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    # a pair with one scored rollout has no spread (advantage 0 for both rows); the two others +-1/sqrt(2) (std 0.707)
    assert sorted(inputs["advantages"].abs().tolist()) == pytest.approx([0.0] * 4 + [0.7071] * 4, abs=1e-3)
    assert (inputs[WEIGHTS_KEY].sum(-1) > 0).any()  # the rows were still generated with mixing
