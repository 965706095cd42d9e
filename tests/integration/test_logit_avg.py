"""Logit averaging on the tiny model through the trainer: at initialisation the policy is its own reference (frozen copy
in full fine-tuning, zero-init LoRA), so the mixed policy is the reference, rollouts are GRPO's and the gradient is
exactly α times GRPO's; once the policy moves, generate's scores and the loss's log-probs are those of
α·z_θ + (1−α)·z_ref; composition with RLOO; construction refusals."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.sampling.logit_averaging import ReferenceLogitMixer, _as_reference, _mixing_generate, reference_step_fn


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _move_policy(trainer, peft: bool) -> None:
    """Move the trainable weights away from the reference (LoRA: the adapter's B matrices, zero at init)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if p.requires_grad and (not peft or "lora_B" in name):
                p.add_(0.3 * torch.randn(p.shape, generator=generator))


def _logits(module, ids, mask, positions=None):
    with torch.no_grad():
        return module(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()


@pytest.mark.parametrize("peft", [False, True])
def test_at_init_the_mix_is_the_reference_and_the_gradient_is_alpha_times_grpo(tmp_path, peft):
    alpha = 0.3
    _, g_plain, in_plain = one_step(ours(tmp_path / "plain", peft))
    trainer = ours(tmp_path / "avg", peft, rollout_filter="logit_avg", logit_avg_alpha=alpha)
    loss, g_avg, in_avg = one_step(trainer)
    # z_θ == z_ref → z_mix == z_ref: the same seeded rollouts, the same log-probs, and d(z_mix)/d(z_θ) = α scales
    # every parameter gradient by α
    assert torch.equal(in_plain["completion_ids"], in_avg["completion_ids"])
    assert torch.isfinite(loss) and grads_differ(g_plain, g_avg)
    for name in g_plain:
        torch.testing.assert_close(g_avg[name], alpha * g_plain[name], atol=1e-6, rtol=1e-4)
    assert (trainer._logit_avg_reference is None) == peft  # LoRA: the adapter-disabled base is the reference


@pytest.mark.parametrize("peft", [False, True])
def test_loss_log_probs_are_those_of_the_mixed_logits(tmp_path, peft):
    trainer = ours(tmp_path, peft, rollout_filter="logit_avg")
    _, _, inputs = one_step(trainer)
    _move_policy(trainer, peft)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    t = inputs["completion_ids"].size(1)
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, t, compute_entropy=True)
    policy = _logits(trainer.model, ids, mask)[:, -t - 1 : -1]
    with _as_reference(trainer, trainer.model) as reference:
        ref = _logits(reference, ids, mask)[:, -t - 1 : -1]
    assert not torch.allclose(policy, ref, atol=1e-3)  # the policy has moved
    logp_all = ((0.5 * policy + 0.5 * ref) / trainer.temperature).log_softmax(-1)
    expected = logp_all.gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    real = inputs["completion_mask"].bool()
    torch.testing.assert_close(logps[real], expected[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropies[real], -(logp_all.exp() * logp_all).sum(-1)[real], atol=1e-5, rtol=1e-5)
    assert (logps[~real] == 0).all()
    # and not the policy's own
    plain = (policy / trainer.temperature).log_softmax(-1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    assert not torch.allclose(logps[real], plain[real], atol=1e-3)
    # the gradient flows to the trainable weights through α z_θ only: the full-FT reference stays frozen
    if not peft:
        assert not any(p.requires_grad for p in trainer._logit_avg_reference.parameters())


@pytest.mark.parametrize("peft", [False, True])
def test_generation_scores_are_the_mixed_logits(tmp_path, peft, tokenizer):
    alpha = 0.5
    trainer = ours(tmp_path, peft, rollout_filter="logit_avg", logit_avg_alpha=alpha)
    _move_policy(trainer, peft)
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    model.eval()
    tokenizer.padding_side = "left"
    prompts = tokenizer(["1+2=", "12+30+4="], return_tensors="pt", padding=True, add_special_tokens=False)
    assert (prompts["attention_mask"] == 0).any()  # one left-padded row
    step = reference_step_fn(trainer, model)
    with _mixing_generate(model, lambda mask: ReferenceLogitMixer(step, mask, alpha)):
        out = model.generate(**prompts, do_sample=False, max_new_tokens=5, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
    # manual: full forwards of the policy and the reference at generate's positions (cumulative mask − 1)
    seq = out.sequences
    mask = torch.cat([prompts["attention_mask"], torch.ones(seq.size(0), seq.size(1) - prompts["input_ids"].size(1),
                                                            dtype=torch.long)], 1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    policy = _logits(model, seq, mask, positions)
    with _as_reference(trainer, model) as reference:
        ref = _logits(reference, seq, mask, positions)
    start = prompts["input_ids"].size(1) - 1
    for k, scores in enumerate(out.scores):  # greedy: the scores are the processed logits, nothing warps them
        torch.testing.assert_close(scores, alpha * policy[:, start + k] + (1 - alpha) * ref[:, start + k],
                                   atol=1e-4, rtol=1e-4)
        assert not torch.allclose(scores, policy[:, start + k], atol=1e-3)
        assert torch.equal(seq[:, start + k + 1], scores.argmax(-1))


def test_training_generation_samples_through_the_mixer(tmp_path, monkeypatch):
    calls = []
    original = ReferenceLogitMixer.__call__

    def spy(self, input_ids, scores):
        mixed = original(self, input_ids, scores)
        calls.append((scores.clone(), mixed))
        return mixed

    monkeypatch.setattr(ReferenceLogitMixer, "__call__", spy)
    trainer = ours(tmp_path, rollout_filter="logit_avg")
    _move_policy(trainer, False)
    _, _, inputs = one_step(trainer)
    assert len(calls) >= inputs["completion_ids"].size(1) - 1  # one per decoding step
    assert any(not torch.allclose(s, m, atol=1e-3) for s, m in calls)  # the reference moved the scores


@pytest.mark.parametrize("peft", [False, True])
def test_composes_with_rloo(tmp_path, peft):
    alpha = 0.5
    _, g_plain, _ = one_step(ours(tmp_path / "plain", peft, advantage_estimator="rloo"))
    loss, g_avg, _ = one_step(ours(tmp_path / "avg", peft, advantage_estimator="rloo", rollout_filter="logit_avg"))
    assert torch.isfinite(loss) and grads_differ(g_plain, g_avg)
    for name in g_plain:
        torch.testing.assert_close(g_avg[name], alpha * g_plain[name], atol=1e-6, rtol=1e-4)


def test_rollout_func_is_refused_at_construction(tmp_path):
    def rollout_func(prompts, trainer):  # never called
        raise AssertionError

    with pytest.raises(ValueError, match="rollout_func"):
        ours(tmp_path, rollout_filter="logit_avg", rollout_func=rollout_func)


def test_old_log_probs_of_the_ratio_are_the_mixed_policys(tmp_path):
    # steps_per_generation 2 with one accumulation step: TRL computes the old log-probs at generation, through the
    # same log-prob method; the moved policy makes mixed and plain log-probs differ
    trainer = ours(tmp_path, rollout_filter="logit_avg", steps_per_generation=2)
    _move_policy(trainer, False)
    _, _, inputs = one_step(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    t = inputs["completion_ids"].size(1)
    with torch.no_grad():
        mixed, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, t)
    policy = _logits(trainer.model, ids, mask)[:, -t - 1 : -1] / trainer.temperature
    plain = policy.log_softmax(-1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    real = inputs["completion_mask"].bool()
    torch.testing.assert_close(inputs["old_per_token_logps"][real], mixed[real])
    assert not torch.allclose(inputs["old_per_token_logps"][real], plain[real], atol=1e-3)
