"""QLoRA on CPU: one real step with a bitsandbytes NF4 base + LoRA, for one variant per stage.

bitsandbytes 0.50 runs NF4 on CPU (its optimised CPU `gemm_4bit` comes from the optional `kernels` package; without
it bitsandbytes prints "Failed to load CPU gemm_4bit_forward from kernels-community" and falls back to its own
dequantise-then-matmul path, which is what runs here). Each test checks that the base really is 4-bit, that the loss
is finite, that gradients reach the adapter and nothing else, and that the variant changes the gradient against
plain GRPO on the same batch (same seed, same completions). Variants that need reference log-probs must use the
base with the adapter disabled: `trainer.ref_model is None` and the reference numbers equal a forward pass under
`disable_adapter()`.
"""

import bitsandbytes as bnb
import torch
from transformers import BitsAndBytesConfig

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step


def _nf4() -> BitsAndBytesConfig:
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=True,
    )


def qlora(tmp_path, **flags):
    return build_trainer(
        trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=True,
        model_init_kwargs={"quantization_config": _nf4()}, **flags,
    )


def _assert_qlora(trainer):
    """The base linears are NF4 `Linear4bit` under LoRA, only adapter weights train, no reference copy exists."""
    four_bit = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    layers = trainer.model.config.num_hidden_layers
    assert len(four_bit) == 7 * layers  # (q, k, v, o, gate, up, down) per layer: every "all-linear" target is 4-bit
    assert all(m.weight.quant_state.quant_type == "nf4" for m in four_bit)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # TRL casts the adapter of a quantized model to bf16 (QLoRA paper recipe), whatever `bf16=` says
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters() if p.requires_grad)
    assert trainer.ref_model is None


def _step(trainer, **kwargs):
    loss, grads, inputs = one_step(trainer, **kwargs)
    assert torch.isfinite(loss)
    assert grads and all("lora_" in n for n in grads)  # gradients reach the adapter ...
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())
    for name, p in trainer.model.named_parameters():  # ... and nothing else (4-bit base, embeddings, norms, head)
        if "lora_" not in name:
            assert p.grad is None, name
    return loss, grads, inputs


def _perturb_adapter(trainer, scale=0.2):
    """LoRA B starts at 0, so policy = base until a step is taken: move the adapter so the reference differs."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=gen))


def _base_logps(trainer, ids, att, n):
    with torch.no_grad(), trainer.model.disable_adapter():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, n)
    return logps


def test_plain_grpo_trains_on_a_4bit_base(tmp_path):
    trainer = qlora(tmp_path, loss_type="grpo")
    _assert_qlora(trainer)
    _step(trainer)


def test_advantage_stage_sign_adv(tmp_path):
    _, g_base, base_inputs = _step(qlora(tmp_path / "base", loss_type="grpo"))
    trainer = qlora(tmp_path / "sign", loss_type="grpo", advantage_estimator="sign_adv")
    _assert_qlora(trainer)
    _, grads, inputs = _step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert grads_differ(g_base, grads)


def test_token_weight_stage_gtpo_entropy(tmp_path):
    _, g_base, _ = _step(qlora(tmp_path / "base", loss_type="grpo"))
    trainer = qlora(tmp_path / "gtpo", loss_type="grpo", token_weighting="gtpo_entropy")
    _assert_qlora(trainer)
    _, grads, inputs = _step(trainer)
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == mask.shape and (adv[mask == 0] == 0).all()
    assert grads_differ(g_base, grads)


def test_token_weight_needing_ref_logps_uses_the_adapter_disabled_4bit_base(tmp_path):
    base = qlora(tmp_path / "base", loss_type="grpo")
    _perturb_adapter(base)
    _, g_base, _ = _step(base)
    trainer = qlora(tmp_path / "frpo", loss_type="grpo", token_weighting="frpo", frpo_beta=1.0)
    _assert_qlora(trainer)  # beta = 0 and a variant that reads reference log-probs: still no second model
    _perturb_adapter(trainer)
    seen = {}
    token_context = trainer._token_context

    def spy(output, rewards, group_size):
        seen["output"], seen["ctx"] = output, token_context(output, rewards, group_size)
        return seen["ctx"]

    trainer._token_context = spy
    _, grads, _ = _step(trainer)
    out, ctx = seen["output"], seen["ctx"]
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    mask = ctx.completion_mask.bool()
    ref = _base_logps(trainer, ids, att, out["completion_ids"].size(1))
    torch.testing.assert_close(ctx.ref_logps[mask], ref[mask], atol=1e-6, rtol=0)  # the reference IS the base
    assert (ctx.ref_logps - ctx.logps)[mask].abs().max() > 1e-3  # ... and not the policy
    assert grads_differ(g_base, grads)


def test_trl_kl_reference_is_the_adapter_disabled_4bit_base(tmp_path):
    trainer = qlora(tmp_path / "kl", loss_type="grpo", beta=0.04)
    _assert_qlora(trainer)
    _perturb_adapter(trainer)
    _, _, inputs = _step(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    mask = inputs["completion_mask"].bool()
    ref = _base_logps(trainer, ids, att, inputs["completion_ids"].size(1))
    torch.testing.assert_close(inputs["ref_per_token_logps"][mask], ref[mask], atol=1e-6, rtol=0)


def test_objective_stage_gpg(tmp_path):
    _, g_base, base_inputs = _step(qlora(tmp_path / "base", loss_type="grpo"))
    trainer = qlora(tmp_path / "gpg", loss_type="gpg", scale_rewards="none")
    _assert_qlora(trainer)
    _, grads, inputs = _step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    assert grads_differ(g_base, grads)


def test_objective_stage_gmpo_off_policy(tmp_path):
    """GMPO equals GRPO's sequence mean at ratio 1, so compare it off-policy: old log-probs taken before the
    adapter moves (the same perturbation for both trainers)."""
    grads = {}
    for loss_type in ("grpo", "gmpo"):
        trainer = qlora(tmp_path / loss_type, loss_type=loss_type)
        _assert_qlora(trainer)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        torch.manual_seed(0)
        batch = next(iter(trainer.get_train_dataloader()))
        torch.manual_seed(0)
        inputs = trainer._prepare_inputs(batch)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            old, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, att, inputs["completion_ids"].size(1)
            )
        _perturb_adapter(trainer, scale=0.05)
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, {**inputs, "old_per_token_logps": old})
        assert torch.isfinite(loss)
        loss.backward()
        grads[loss_type] = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        assert all("lora_" in n for n in grads[loss_type])
    assert grads_differ(grads["grpo"], grads["gmpo"])


def test_sampling_stage_gfpo(tmp_path):
    flags = {"loss_type": "dapo", "shuffle_dataset": False}
    # seed 2: with the 4-bit base's completions, seeds 0-1 keep only equal-reward pairs (all advantages 0)
    _, g_base, base_inputs = _step(qlora(tmp_path / "base", **flags), seed=2)
    trainer = qlora(tmp_path / "gfpo", rollout_filter="gfpo", gfpo_keep=2, **flags)
    _assert_qlora(trainer)
    _, grads, inputs = _step(trainer, seed=2)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])
    assert (inputs["completion_mask"].sum(-1) == 0).any()  # dropped rollouts are masked out
    assert grads_differ(g_base, grads)
