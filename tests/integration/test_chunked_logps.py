"""`logps_chunk_size` on the tiny model: same log-probs, entropies and gradients as TRL's own (fused, unchunked over
the sequence) path, full fine-tuning, LoRA and QLoRA; one training step gives the same gradients with and without.

Tolerances: TRL 1.16's head is itself a float32 online-log-sum-exp kernel, so the two paths round differently. Both
are compared with a float64 recomputation of the full logits (chunked: within 1e-6 + 1e-6·|x|; TRL: 2e-6, its
`log Z − E[z]` entropy sits ~1.3e-6 from float64 here), and with each other (log-probs 1e-6 + 1e-6·|x|, entropies
2e-6). Training-step gradients agree to 1e-6 absolute; where a float32 sum is reordered or amplified (a weight
gradient summed over rows, frpo's suffix sums of log-prob differences) a 1e-5 relative term is added.
"""

import copy
from pathlib import Path

import pytest
import torch
import trl

import trl_groupx
from tests.conftest import base_config_kwargs, build_trainer, grads_differ, one_step
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.toy import arithmetic_dataset, load_tiny_tokenizer

CHUNKS = [1, 5, 7, 1000]  # 5 and 7 divide neither the completion length nor B × T_c

# Two fp32 computations of one quantity in different reduction orders (chunked against full-vocabulary logits,
# TRL's path against ours) differ by a few ulps of the accumulations, more on CPUs whose kernels vectorise wider
# (AVX-512 against AVX2): 1e-5 absolute, far below any difference a wrong formula makes.
FP32_ATOL = 1e-5


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _batch(trainer):
    trainer.model.train()
    torch.manual_seed(0)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    return ids, att, inputs["completion_ids"].size(1), inputs["completion_mask"].bool()


def _logps_and_grads(trainer, ids, att, keep, chunk_size, batch_size=None):
    trainer.args.logps_chunk_size = chunk_size
    trainer.model.zero_grad(set_to_none=True)
    logps, ent, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, att, keep, batch_size=batch_size, compute_entropy=True
    )
    gen = torch.Generator().manual_seed(0)  # an arbitrary objective that uses both outputs
    objective = (logps * torch.randn(logps.shape, generator=gen)).mean()
    (objective + (ent * torch.randn(ent.shape, generator=gen)).mean()).backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return logps.detach(), ent.detach(), grads


def _float64_truth(trainer, ids, att, keep, temperature):
    model = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).double()
    with torch.no_grad():  # decoder body and LM head by hand: the model's own forward returns float32 logits
        hidden = model.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state
        logits = model.get_output_embeddings()(hidden[:, -keep - 1 : -1]) / temperature
    logp = logits.log_softmax(-1)
    return logp.gather(-1, ids[:, -keep:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_logps_entropies_and_gradients_equal_trl(tmp_path, peft):
    trainer = ours(tmp_path, peft, temperature=0.7)
    ids, att, keep, mask = _batch(trainer)
    trl_logps, trl_ent, trl_grads = _logps_and_grads(trainer, ids, att, keep, None)
    truth_logps, truth_ent = _float64_truth(trainer, ids, att, keep, 0.7)
    for x, truth in ((trl_logps, truth_logps), (trl_ent, truth_ent)):
        torch.testing.assert_close(x[mask].double(), truth[mask], atol=FP32_ATOL, rtol=1e-6)
    for chunk in CHUNKS:
        for batch_size in (None, 3):  # TRL's micro-batching over sequences, 3 does not divide 8
            logps, ent, grads = _logps_and_grads(trainer, ids, att, keep, chunk, batch_size)
            torch.testing.assert_close(logps[mask].double(), truth_logps[mask], atol=FP32_ATOL, rtol=1e-6)
            torch.testing.assert_close(ent[mask].double(), truth_ent[mask], atol=FP32_ATOL, rtol=1e-6)
            torch.testing.assert_close(logps, trl_logps, atol=FP32_ATOL, rtol=1e-6)
            torch.testing.assert_close(ent, trl_ent, atol=FP32_ATOL, rtol=0)
            assert (logps[~mask] == 0).all() and (ent[~mask] == 0).all()  # padding is 0, as in TRL
            assert grads.keys() == trl_grads.keys()
            for name in grads:
                torch.testing.assert_close(grads[name], trl_grads[name], atol=FP32_ATOL, rtol=1e-5)


def test_unset_flag_is_trl_bit_for_bit(tmp_path):
    trainer = ours(tmp_path)
    ids, att, keep, _ = _batch(trainer)
    with torch.no_grad():
        a = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, keep, compute_entropy=True)
        b = trl.GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, att, keep, compute_entropy=True
        )
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize(
    "flags",
    [
        {},  # TRL's default loss (dapo)
        {"loss_type": "gmpo"},  # a trl_groupx objective (its own `_compute_loss`)
        {"loss_type": "grpo", "entropy_coef": 0.01},  # entropy bonus: gradient through the chunked entropies
        {"gradient_checkpointing": True},  # TRL's GPU default: the decoder body is checkpointed layer by layer
    ],
    ids=["dapo", "gmpo", "entropy_bonus", "grad_ckpt"],
)
def test_one_training_step_gives_the_same_gradients(tmp_path, peft, flags):
    loss0, g0, inputs0 = one_step(ours(tmp_path / "trl", peft, temperature=0.7, **flags))
    for chunk in (3, 7):
        trainer = ours(tmp_path / f"c{chunk}", peft, temperature=0.7, logps_chunk_size=chunk, **flags)
        loss, g, inputs = one_step(trainer)
        assert torch.equal(inputs["completion_ids"], inputs0["completion_ids"])
        torch.testing.assert_close(loss, loss0, atol=1e-6, rtol=0)
        assert g.keys() == g0.keys()
        for name in g0:
            torch.testing.assert_close(g[name], g0[name], atol=1e-6, rtol=0)


def _perturb_adapter(trainer):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("flags", [{"beta": 0.04}, {"token_weighting": "frpo", "frpo_beta": 1.0}], ids=["kl", "frpo"])
def test_reference_from_the_adapter_disabled_base_goes_through_the_chunked_path(tmp_path, flags):
    """LoRA, reference = base with the adapter disabled (TRL's KL; a token weight reading ref and old log-probs)."""
    results = []
    for chunk in (None, 5):
        trainer = ours(tmp_path / str(chunk), True, loss_type="grpo", logps_chunk_size=chunk, **flags)
        assert trainer.ref_model is None
        _perturb_adapter(trainer)
        results.append(one_step(trainer))
    (loss0, g0, in0), (loss, g, inputs) = results
    if "beta" in flags:
        torch.testing.assert_close(inputs["ref_per_token_logps"], in0["ref_per_token_logps"], atol=1e-6, rtol=0)
    # frpo's advantages sum (old − ref) log-prob differences over the future tokens: rounding adds up (~2e-6)
    torch.testing.assert_close(inputs["advantages"], in0["advantages"], atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, loss0, atol=1e-6, rtol=0)
    for name in g0:
        torch.testing.assert_close(g[name], g0[name], atol=1e-6, rtol=1e-5)


def test_qlora_step_is_unchanged(tmp_path):
    from transformers import BitsAndBytesConfig

    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    runs = [
        one_step(ours(tmp_path / str(c), True, model_init_kwargs={"quantization_config": nf4}, logps_chunk_size=c))
        for c in (None, 4)
    ]
    (loss0, g0, _), (loss, g, _) = runs
    torch.testing.assert_close(loss, loss0, atol=1e-6, rtol=0)
    for name in g0:  # the adapter is bf16 under QLoRA (TRL casts it): compare at bf16 resolution
        torch.testing.assert_close(g[name].float(), g0[name].float(), atol=FP32_ATOL, rtol=1e-2)


def test_entropy_consuming_token_weight_sees_the_same_entropies(tmp_path):
    """gtpo_entropy z-scores entropies per position with a 1e-8 variance floor, so rounding-level entropy
    differences (~1e-6) can move its advantages visibly on near-tied groups; what this path must deliver is the same
    entropies and log-probs to the token-weight stage."""
    contexts = []
    for chunk in (None, 3):
        trainer = ours(tmp_path / str(chunk), loss_type="grpo", token_weighting="gtpo_entropy", logps_chunk_size=chunk)
        token_context = trainer._token_context
        trainer._token_context = lambda o, r, g, f=token_context: contexts.append(f(o, r, g)) or contexts[-1]
        one_step(trainer)
    a, b = contexts
    torch.testing.assert_close(b.entropies, a.entropies, atol=FP32_ATOL, rtol=0)


def _trainer_for(model, tmp_path, **flags):
    return trl_groupx.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=arithmetic_dataset(8, seed=0), processing_class=load_tiny_tokenizer(),
        args=trl_groupx.GRPOConfig(**base_config_kwargs(tmp_path, temperature=0.9, **flags)),
    )


@pytest.mark.parametrize("family", ["gemma2_softcap", "granite_logits_scaling", "cohere_logit_scale"])
def test_logit_softcapping_and_scaling_match_trl(tmp_path, family):
    import transformers as tf

    small = {"vocab_size": 104, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "pad_token_id": 0,
             "eos_token_id": 2, "bos_token_id": 1}
    if family == "gemma2_softcap":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**small, final_logit_softcapping=1.5))
    elif family == "granite_logits_scaling":
        model = tf.GraniteForCausalLM(tf.GraniteConfig(**small, logits_scaling=0.25))
    else:
        model = tf.CohereForCausalLM(tf.CohereConfig(**small, logit_scale=3.0))
    trainer = _trainer_for(model, tmp_path)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 104, (4, 12), generator=gen)
    att = torch.ones_like(ids)
    att[0, -2:] = 0
    trl_logps, trl_ent, trl_grads = _logps_and_grads(trainer, ids, att, 5, None)
    logps, ent, grads = _logps_and_grads(trainer, ids, att, 5, 3)
    torch.testing.assert_close(logps, trl_logps, atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(ent, trl_ent, atol=FP32_ATOL, rtol=0)
    for name in trl_grads:
        torch.testing.assert_close(grads[name], trl_grads[name], atol=FP32_ATOL, rtol=1e-5)


def test_multimodal_inputs_are_refused_naming_the_flag(tmp_path):
    trainer = ours(tmp_path, logps_chunk_size=4)
    ids, att, keep, _ = _batch(trainer)
    with pytest.raises(ValueError, match="logps_chunk_size"):
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, keep, pixel_values=torch.zeros(8, 3))


def test_lora_with_chunking_still_differs_from_a_variant(tmp_path):
    """Sanity: the chunked path is not a constant — a variant still changes the gradient through it."""
    _, g0, _ = one_step(ours(tmp_path / "a", True, loss_type="grpo", logps_chunk_size=4))
    trainer = ours(tmp_path / "b", True, loss_type="grpo", advantage_estimator="sign_adv", logps_chunk_size=4)
    _, g1, _ = one_step(trainer)
    assert grads_differ(g0, g1)


@needs_torchrun
def test_two_processes_ddp_step_matches_trl(tmp_path):
    """torchrun, 2 CPU processes: the chunked forward is called on the DDP-wrapped model, so the gradients are
    all-reduced — both ranks end the step with identical weights, equal to the plain TRL run's."""
    worker = Path(__file__).with_name("chunked_logps_ddp_worker.py")
    launch(worker, tmp_path, timeout=900)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert "DistributedDataParallel" in r0["wrapped"]
    for name, p in r0["plain"].items():
        torch.testing.assert_close(r0["chunked"][name], r1["chunked"][name], atol=0, rtol=0)  # synced ranks
        torch.testing.assert_close(r0["chunked"][name], p, atol=1e-6, rtol=0)  # = TRL's step
    assert any(not torch.equal(p, r0["initial"][n]) for n, p in r0["chunked"].items())  # the step did train
