"""HAPO's Adaptive Temperature Sampling on the tiny model: the logits processor reaches TRL's `generate` (sampling
changes at the same seed, τ = 0 is plain sampling), the statistics are the rollout policy's entropies of the previous
batch, the first batch is plain sampling, training (full, LoRA) and the composition with HAPO's token stage."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.sampling.adaptive_temperature import STATE_KEY, EntropyStatistics, _records, entropy_statistics
from trl_groupx.toy.counter_rollout import make_counter_game_rollout

# a plausible previous batch for the tiny model (its log-entropies are around 1 ± 0.5)
STATS = EntropyStatistics(median=1.0, std=0.5, pos_max=1.0, neg_min=-2.0)


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _sample(trainer, seed=0):
    """One training generation call of TRL's `_generate_single_turn` (through ours) on the first batch's prompts."""
    trainer.model.train()
    torch.manual_seed(seed)
    batch = next(iter(trainer.get_train_dataloader()))
    prompt_ids, _, _ = trainer._tokenize_prompts([x["prompt"] for x in batch])
    torch.manual_seed(seed)
    completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, trainer.num_generations)
    return completions


def _with_stats(tmp_path, **flags):
    trainer = ours(tmp_path, hapo_adaptive_temperature=True, max_completion_length=16, **flags)
    trainer.variant_state[STATE_KEY].update(STATS._asdict())
    return trainer


def test_processor_changes_sampling_and_tau_zero_is_plain_sampling(tmp_path):
    plain = _sample(ours(tmp_path / "plain", max_completion_length=16))
    adaptive = _with_stats(tmp_path / "adaptive", hapo_temperature_tau=0.9, hapo_temperature_official_sign=True)
    hot = _sample(adaptive)
    assert hot != plain  # same seed, same RNG draws, other per-token temperatures
    assert "generate" not in vars(adaptive.accelerator.unwrap_model(adaptive.model_wrapped))  # shadow removed
    assert _sample(_with_stats(tmp_path / "tau0", hapo_temperature_tau=0.0)) == plain  # factor 1: bit-identical
    # the paper's sign samples low-entropy tokens colder: yet another draw
    cold = _sample(_with_stats(tmp_path / "paper", hapo_temperature_tau=0.9, hapo_temperature_official_sign=False))
    assert cold not in (plain, hot)


def test_statistics_are_the_previous_batchs_rollout_entropies(tmp_path):
    trainer = ours(tmp_path, hapo_adaptive_temperature=True, temperature=0.8, hapo_temperature_official_sign=True)
    _, _, inputs = one_step(trainer)  # first batch: sampled at T, its statistics recorded
    assert not any(k.startswith("hapo/") for k in trainer._metrics["train"])  # nothing applied yet (official)
    # what the official old-log-prob pass computes: the rollout policy's entropies at T over the response tokens
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        _, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_entropy=True)
    expected = entropy_statistics(entropies[inputs["completion_mask"].bool()], 0.8)
    stored = EntropyStatistics(**trainer.variant_state[STATE_KEY])
    assert stored == pytest.approx(expected, rel=1e-4, abs=1e-5)  # generation-time logits vs one full forward
    saved = tmp_path / "state.pt"  # saved with checkpoints: plain floats load under weights_only
    torch.save(trainer.variant_state, saved)
    assert torch.load(saved, weights_only=True) == trainer.variant_state
    one_step(trainer, seed=1)  # second batch: sampled with them
    scale = trainer._metrics["train"]
    assert 1.0 < scale["hapo/temperature_scale_mean"][0] <= scale["hapo/temperature_scale_max"][0] <= 1.05 + 1e-6
    assert EntropyStatistics(**trainer.variant_state[STATE_KEY]) != stored  # replaced by the second batch's


def test_evaluation_generation_is_plain_and_records_nothing(tmp_path):
    trainer = _with_stats(tmp_path, hapo_temperature_tau=0.9)
    trainer.model.eval()
    prompt_ids, _, _ = trainer._tokenize_prompts([[{"role": "user", "content": "1+2="}]] * 2)
    trainer._generate_single_turn(prompt_ids, None, {}, 2)
    assert _records(trainer).entropies == []


@pytest.mark.parametrize("peft", [False, True])
def test_first_step_is_plain_grpo_then_the_gradient_changes(tmp_path, peft):
    plain = ours(tmp_path / "plain", peft, max_completion_length=12)
    adaptive = ours(tmp_path / "adaptive", peft, max_completion_length=12, hapo_adaptive_temperature=True,
                    hapo_temperature_tau=0.5)
    _, g_plain, _ = one_step(plain)
    _, g_adaptive, _ = one_step(adaptive)
    assert not grads_differ(g_plain, g_adaptive, atol=0)  # no statistics yet: the official first step
    _, g_plain, in_plain = one_step(plain, seed=1)
    loss, g_adaptive, in_adaptive = one_step(adaptive, seed=1)
    assert not torch.equal(in_plain["completion_ids"], in_adaptive["completion_ids"])
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in g_adaptive.values())
    assert grads_differ(g_plain, g_adaptive)
    assert trl_groupx.GRPOTrainer is type(adaptive) and adaptive._metrics["train"]["hapo/temperature_scale_mean"]


def test_composes_with_hapo_token_weights(tmp_path):
    flags = dict(trl_groupx.get_variant("hapo").flags)  # TLGA + DAR, DAPO loss, adaptive temperature τ = 0.05
    assert flags["hapo_adaptive_temperature"] is True and flags["hapo_temperature_tau"] == 0.05
    trainer = ours(tmp_path, max_completion_length=12, **flags)
    one_step(trainer)
    loss, grads, inputs = one_step(trainer, seed=1)
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())
    assert inputs["advantages"].dim() == 2  # HAPO's token stage ran on the adaptively sampled batch
    metrics = trainer._metrics["train"]
    low, high = metrics["hapo/temperature_scale_min"][0], metrics["hapo/temperature_scale_max"][0]
    assert 0.95 - 1e-6 <= low < 1.0 < high <= 1.05 + 1e-6  # paper's sign: T(1 − τ) ≤ T_t ≤ T(1 + τ), both ways


def test_a_rollout_func_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="hapo_adaptive_temperature=True applies a logits processor"):
        ours(tmp_path, hapo_adaptive_temperature=True, rollout_func=make_counter_game_rollout())
