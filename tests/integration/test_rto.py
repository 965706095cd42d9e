"""RTO on the tiny model with a local "DPO model": DPO model = reference gives GRPO's gradient; a different DPO model
changes it, and the trained token advantages equal A_i + the reward-to-go of the clipped DPO token rewards and the
reward-side KL, recomputed here independently; unclipped, the first token's reward-to-go is the DPO implicit
sequence reward; full fine-tuning (TRL's reference, beta > 0) and LoRA (the base); an objective composition;
construction errors name rto_dpo_model."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import _perturb, ours
from tests.integration.test_dgrpo import teachers  # noqa: F401  (fixture: local perturbed / mismatched models)
from trl_groupx.toy import tiny_model_path

PEFT = [False, True]


def _ids(inputs):
    return (torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1))


def _policy_and_reference_logps(trainer, inputs, peft):
    """The trained rows' log-probs under the policy and its initial model (LoRA base, or TRL's reference model)."""
    ids, att = _ids(inputs)
    t = inputs["completion_ids"].size(1)
    with torch.no_grad():
        old = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, t)[0]
        if peft:
            with trainer.model.disable_adapter():
                ref = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, t)[0]
        else:
            ref = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, att, t)[0]
    return old, ref


def _dpo_logps(path, inputs, temperature):
    """The DPO model's log-probs of the sampled tokens, from a plain transformers forward."""
    ids, att = _ids(inputs)
    t = inputs["completion_ids"].size(1)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits[:, -t - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def _reference_flags(peft):
    # the reference: the LoRA base with beta = 0, TRL's reference model (beta > 0) under full fine-tuning
    return {} if peft else {"beta": 0.04}


@pytest.mark.parametrize("peft", PEFT)
def test_dpo_model_equal_to_reference_gives_grpo(tmp_path, peft):
    # the DPO model is the policy's initial checkpoint: log π_dpo = log π_ref on every token → no token reward; the
    # policy is still its initial model at the first step → no KL reward: GRPO's advantages and gradient
    _, expected, inputs_grpo = one_step(ours(tmp_path / "grpo", peft, **_reference_flags(peft)))
    trainer = ours(tmp_path / "rto", peft, token_weighting="rto", rto_dpo_model=tiny_model_path(),
                   rto_dpo_reward_scale=1.0, rto_dpo_reward_clip=0.0, **_reference_flags(peft))
    _, got, inputs = one_step(trainer)
    mask = inputs["completion_mask"]
    torch.testing.assert_close(inputs["advantages"], inputs_grpo["advantages"][:, None] * mask, atol=1e-6, rtol=0)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("peft", PEFT)
def test_a_different_dpo_model_gives_the_recomputed_token_advantages(tmp_path, teachers, peft):  # noqa: F811
    # both trainers' weights moved alike (policy ≠ its initial model: the KL reward is not 0); same rollouts
    flags = dict(rto_dpo_reward_scale=0.5, rto_dpo_reward_clip=0.3, rto_kl_coef=0.5, **_reference_flags(peft))
    grpo = ours(tmp_path / "grpo", peft, **_reference_flags(peft))
    _perturb(grpo)
    _, g_grpo, inputs_grpo = one_step(grpo)
    trainer = ours(tmp_path / "rto", peft, token_weighting="rto", rto_dpo_model=teachers["other"], **flags)
    _perturb(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])
    mask = inputs["completion_mask"]
    old, ref = _policy_and_reference_logps(trainer, inputs, peft)
    dpo = _dpo_logps(teachers["other"], inputs, trainer.temperature)
    # r_t = clip(β1 (log π_dpo − log π_ref), ±c) − κ (log π_old − log π_ref); A_t = A_i + Σ_{k≥t} r_k
    dpo_reward = (0.5 * (dpo - ref)).clamp(-0.3, 0.3) * mask
    kl_reward = -0.5 * (old - ref) * mask
    to_go = (dpo_reward + kl_reward).flip(-1).cumsum(-1).flip(-1)
    expected = (inputs_grpo["advantages"][:, None] + to_go) * mask
    torch.testing.assert_close(inputs["advantages"], expected, atol=1e-5, rtol=1e-4)
    real = mask.bool()
    assert ((dpo - ref).abs()[real] > 0.6).any() and ((dpo - ref).abs()[real] < 0.6).any()  # clipped and not
    assert (old - ref).abs()[real].max() > 1e-3 and to_go.abs().max() > 0.05
    assert grads_differ(g_grpo, grads)


def test_unclipped_token_rewards_sum_to_the_dpo_implicit_reward(tmp_path, teachers):  # noqa: F811
    # catalog check on the trainer: with no clip and no KL reward, A_{i,0} − A_i = β1 log(π_dpo(y|x) / π_ref(y|x)),
    # the sequence log-likelihoods from transformers' own loss (labels on the completion tokens only)
    beta1 = 0.1
    _, _, inputs_grpo = one_step(ours(tmp_path / "grpo", beta=0.04))
    trainer = ours(tmp_path / "rto", token_weighting="rto", rto_dpo_model=teachers["other"], beta=0.04,
                   rto_dpo_reward_scale=beta1, rto_dpo_reward_clip=0.0, rto_kl_coef=0.0)
    _, _, inputs = one_step(trainer)
    assert trainer.temperature == 1.0  # the sequence likelihoods below read raw logits
    ids, att = _ids(inputs)
    labels = ids.masked_fill(att == 0, -100)
    labels[:, : inputs["prompt_ids"].size(1)] = -100

    def sequence_logp(model):
        out = []
        for i in range(ids.size(0)):
            with torch.no_grad():
                loss = model(input_ids=ids[i : i + 1], attention_mask=att[i : i + 1], labels=labels[i : i + 1]).loss
            out.append(-loss * (labels[i, 1:] != -100).sum())
        return torch.stack(out)

    implicit = beta1 * (sequence_logp(AutoModelForCausalLM.from_pretrained(teachers["other"]))
                        - sequence_logp(trainer.ref_model))
    first = inputs["advantages"][:, 0] - inputs_grpo["advantages"]
    torch.testing.assert_close(first, implicit, atol=1e-4, rtol=1e-4)
    assert implicit.abs().max() > 0.05


def test_lora_trains_the_adapter_and_keeps_the_dpo_model_frozen(tmp_path, teachers):  # noqa: F811
    trainer = ours(tmp_path, True, token_weighting="rto", rto_dpo_model=teachers["other"])
    dpo = trainer._dpo_model
    assert not dpo.training and not any(p.requires_grad for p in dpo.parameters())
    before_dpo = {n: p.detach().clone() for n, p in dpo.named_parameters()}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert all(p.grad is None and torch.equal(before_dpo[n], p) for n, p in dpo.named_parameters())


def test_composes_with_an_objective_variant(tmp_path, teachers):  # noqa: F811
    # token advantages (B, T) into the dual-clip objective: the DPO rewards change its gradient
    _, base, _ = one_step(ours(tmp_path / "a", True, loss_type="dual_clip"))
    trainer = ours(tmp_path / "b", True, loss_type="dual_clip", token_weighting="rto", rto_dpo_model=teachers["other"],
                   rto_dpo_reward_scale=1.0)
    loss, grads, inputs = one_step(trainer)
    assert inputs["advantages"].shape == inputs["completion_mask"].shape and torch.isfinite(loss)
    assert grads_differ(base, grads)


def test_construction_errors_name_rto_dpo_model(tmp_path, teachers):  # noqa: F811
    with pytest.raises(ValueError, match="rto_dpo_model is not set: pass the model id or local path"):
        ours(tmp_path / "a", True, token_weighting="rto")
    with pytest.raises(ValueError, match="rto_dpo_model=.*different tokenizer.*DPO model of the same model family"):
        ours(tmp_path / "b", True, token_weighting="rto", rto_dpo_model=teachers["other_tokenizer"])
    with pytest.raises(ValueError, match="rto_dpo_model=.*vocab_size 100 but the student has 104"):
        ours(tmp_path / "c", True, token_weighting="rto", rto_dpo_model=teachers["small_vocab"])
    with pytest.raises(ValueError, match="rto_dpo_model=.*no tokenizer|rto_dpo_model=.*could not be loaded"):
        ours(tmp_path / "d", True, token_weighting="rto", rto_dpo_model=str(tmp_path / "missing"))
    # full fine-tuning with beta = 0 has no initial model to take the token rewards against
    with pytest.raises(ValueError, match="token_weighting='rto' needs reference log-probs.*LoRA.*beta > 0"):
        ours(tmp_path / "e", token_weighting="rto", rto_dpo_model=teachers["other"])
