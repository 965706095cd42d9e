"""`prefix_grouper` on the shipped tiny Llama: the shared-prefix forward gives TRL's log-probs, entropies and
gradients (eager and sdpa, full and LoRA), and a GRPO step with the flag gives the step without it.

Tolerance (float32): every compared tensor `x` satisfies max|x_flag − x_trl| ≤ 1e-5 · max(1, max|x_trl|); observed
gaps are ≤ 2e-6 of that scale (log-probs ≤ 3e-6 absolute at |x| ≈ 10). The two paths do the same float32 arithmetic
in a different order (the prompt's gradient is one index-gather backward over G rows instead of G separate rows;
the LM head sees a different number of rows), and Llama's RMSNorm rounds to float32 even in a float64 model. The
restructuring itself is exact: `tests/unit/memory/test_prefix_grouper.py` checks hidden states and all gradients
against the standard forward to 1e-10 in float64."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_trainer, one_step
from trl_groupx import GRPOConfig, GRPOTrainer

REL = 1e-5


def assert_equal_to_float32(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = max(1.0, want.abs().max().item())
    gap = (got - want).abs().max().item()
    assert gap <= REL * scale, f"{what}: max gap {gap:.3e} > {REL:.0e} x {scale:.3g}"


def grouped_batch(seed: int = 0, vocab: int = 104):
    """Three prompts of 5, 9 and 3 tokens left-padded to 9, four completions each of random length right-padded to
    7, rows shuffled (so micro-batches of 4 split groups)."""
    g = torch.Generator().manual_seed(seed)
    width_p, width_c, group = 9, 7, 4
    ids, mask = [], []
    for n in (5, 9, 3):
        prompt = torch.randint(3, vocab, (n,), generator=g)
        for _ in range(group):
            p_ids = torch.zeros(width_p, dtype=torch.long)
            p_mask = torch.zeros(width_p, dtype=torch.long)
            p_ids[width_p - n :], p_mask[width_p - n :] = prompt, 1
            length = int(torch.randint(1, width_c + 1, (1,), generator=g))
            c_ids = torch.zeros(width_c, dtype=torch.long)
            c_mask = torch.zeros(width_c, dtype=torch.long)
            c_ids[:length], c_mask[:length] = torch.randint(3, vocab, (length,), generator=g), 1
            ids.append(torch.cat([p_ids, c_ids]))
            mask.append(torch.cat([p_mask, c_mask]))
    perm = torch.randperm(len(ids), generator=g)
    return torch.stack(ids)[perm], torch.stack(mask)[perm], width_c


def logps_entropies_grads(trainer, flag: bool, ids, mask, keep, batch_size):
    trainer.args.prefix_grouper = flag
    model = trainer.model
    model.zero_grad(set_to_none=True)
    logps, ent, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, keep, batch_size=batch_size, compute_entropy=True
    )
    weights = torch.randn(logps.shape, generator=torch.Generator().manual_seed(1))
    ((logps * weights).sum() + (ent * weights).sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), ent.detach(), grads


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logps_entropies_and_grads_equal_trl(tmp_path, attn, peft):
    trainer = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, peft=peft, temperature=0.7,
                            model_init_kwargs={"attn_implementation": attn})
    assert trainer.accelerator.unwrap_model(trainer.model).config._attn_implementation == attn
    trainer.model.train()
    ids, mask, keep = grouped_batch()
    for batch_size in (None, 4):  # whole batch (3 groups of 4), and micro-batches of 4 that split the groups
        want = logps_entropies_grads(trainer, False, ids, mask, keep, batch_size)
        got = logps_entropies_grads(trainer, True, ids, mask, keep, batch_size)
        target_mask = mask[:, -keep:].bool()
        assert (got[0][~target_mask] == 0).all() and (got[1][~target_mask] == 0).all()
        assert_equal_to_float32(got[0], want[0], "log-probs")
        assert_equal_to_float32(got[1], want[1], "entropies")
        assert got[2].keys() == want[2].keys() and len(want[2]) > 0
        for name in want[2]:
            assert_equal_to_float32(got[2][name], want[2][name], name)
    # the flag actually took the grouped path: its patched forward is installed on the inner model
    inner = trainer.accelerator.unwrap_model(trainer.model)
    inner = inner.get_base_model() if peft else inner
    assert getattr(inner, "_groupx_prefix_grouper_installed", False)


def test_combines_with_logps_chunk_size(tmp_path):
    trainer = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, logps_chunk_size=5)
    trainer.model.train()
    ids, mask, keep = grouped_batch(seed=3)
    trainer.args.logps_chunk_size = None
    want = logps_entropies_grads(trainer, False, ids, mask, keep, None)  # TRL
    trainer.args.logps_chunk_size = 5
    got = logps_entropies_grads(trainer, True, ids, mask, keep, None)  # shared prefix + chunked head
    assert_equal_to_float32(got[0], want[0], "log-probs")
    assert_equal_to_float32(got[1], want[1], "entropies")
    for name in want[2]:
        assert_equal_to_float32(got[2][name], want[2][name], name)


def test_no_grad_call_and_single_completion_token(tmp_path):
    trainer = build_trainer(GRPOTrainer, GRPOConfig, tmp_path)
    ids, mask, _ = grouped_batch(seed=5)
    ids, mask = ids[:, :10], mask[:, :10].clone()  # 9 prompt columns + 1 completion token
    mask[:, -1] = 1
    outs = []
    for flag in (False, True):
        trainer.args.prefix_grouper = flag
        with torch.no_grad():
            outs.append(trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 1, compute_entropy=False))
    assert outs[1][1] is None and outs[1][0].shape == (ids.size(0), 1)
    assert_equal_to_float32(outs[1][0], outs[0][0], "log-probs")


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_training_step_equals_plain_trl(tmp_path, peft):
    # gradient_accumulation_steps=2: the 16-row generation batch (4 groups of 4) is shuffled and split into two
    # micro-batches of 8, so groups are broken across micro-batches. beta > 0 also runs the reference log-probs
    # (the adapter-disabled base with LoRA, a second model otherwise) through the flag's path.
    kwargs = {
        "peft": peft, "gradient_accumulation_steps": 2, "beta": 0.04, "model_init_kwargs": {"attn_implementation": "sdpa"}
    }
    plain = build_trainer(GRPOTrainer, GRPOConfig, tmp_path / "plain", **kwargs)
    grouped = build_trainer(GRPOTrainer, GRPOConfig, tmp_path / "grouped", prefix_grouper=True, **kwargs)
    loss0, g0, in0 = one_step(plain)
    loss1, g1, in1 = one_step(grouped)
    assert torch.equal(in0["completion_ids"], in1["completion_ids"])  # same rollouts
    assert_equal_to_float32(in1["ref_per_token_logps"], in0["ref_per_token_logps"], "reference log-probs")
    assert_equal_to_float32(loss1, loss0, "loss")
    assert g1.keys() == g0.keys() and len(g0) > 0
    for name in g0:
        assert_equal_to_float32(g1[name], g0[name], name)


def test_trainer_refuses_gradient_checkpointing(tmp_path):
    with pytest.raises(ValueError, match="prefix_grouper"):
        build_trainer(GRPOTrainer, GRPOConfig, tmp_path, prefix_grouper=True, gradient_checkpointing=True)


def test_qlora_logps_and_grads_match(tmp_path):
    """QLoRA (NF4 base on CPU, bf16 adapter as TRL casts it): same log-probs/entropies; adapter gradients agree to
    bf16 rounding (the adapter's matmuls round to bf16, so float32-level input differences can flip a last bit)."""
    from transformers import BitsAndBytesConfig

    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
                             bnb_4bit_use_double_quant=True)
    trainer = build_trainer(GRPOTrainer, GRPOConfig, tmp_path, peft=True, model_init_kwargs={"quantization_config": nf4})
    trainer.model.train()
    ids, mask, keep = grouped_batch(seed=7)
    want = logps_entropies_grads(trainer, False, ids, mask, keep, None)
    got = logps_entropies_grads(trainer, True, ids, mask, keep, None)
    assert_equal_to_float32(got[0], want[0], "log-probs")
    assert_equal_to_float32(got[1], want[1], "entropies")
    assert want[2] and got[2].keys() == want[2].keys() and all("lora_" in n for n in want[2])
    for name in want[2]:
        scale = want[2][name].float().abs().max().item()
        gap = (got[2][name].float() - want[2][name].float()).abs().max().item()
        assert gap <= 1e-2 * max(scale, 1e-6), (name, gap, scale)
