"""`prefix_grouper` pieces without a trainer: grouping of identical prompts, the config check and the refusals."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, MistralForCausalLM

from trl_groupx import GRPOConfig
from trl_groupx.memory.prefix_grouper import check_supported, group_rows
from trl_groupx.toy import tiny_model_path


def test_group_rows_matches_prompts_by_unmasked_tokens_and_mask():
    # rows 0, 2, 4 hold prompt A = [5, 6] left-padded to 3 (row 4 has a different token under the padding, which
    # does not count); row 1 is prompt B = [7, 5, 6] (same tail as A, different mask); row 3 is A's tokens with a
    # different mask [1, 1, 1] and token 0 at the front, i.e. a third prompt.
    ids = torch.tensor([[0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6], [9, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]])
    rep, inv = group_rows(ids, mask)
    assert len(rep) == 3
    assert inv[0] == inv[2] == inv[4]
    assert len({int(inv[0]), int(inv[1]), int(inv[3])}) == 3
    # each representative is the first row of its group and carries that group's prompt
    assert sorted(rep.tolist()) == [0, 1, 3]
    assert torch.equal(inv[rep], torch.arange(3))


def test_group_rows_all_distinct_and_all_equal():
    ids = torch.arange(12).view(4, 3)
    rep, inv = group_rows(ids, torch.ones_like(ids))
    assert sorted(rep.tolist()) == [0, 1, 2, 3] and torch.equal(inv[rep], torch.arange(4))
    ids = torch.tensor([[1, 2, 3]]).repeat(5, 1)
    rep, inv = group_rows(ids, torch.ones_like(ids))
    assert rep.tolist() == [0] and inv.tolist() == [0] * 5


def test_config_refuses_gradient_checkpointing_and_non_bool(tmp_path):
    with pytest.raises(ValueError, match="prefix_grouper.*gradient_checkpointing=False"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, prefix_grouper=True)  # TRL's default is True
    with pytest.raises(ValueError, match="prefix_grouper"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, prefix_grouper="yes", gradient_checkpointing=False)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, prefix_grouper=True, gradient_checkpointing=False)
    assert args.prefix_grouper and args.active_variants() == GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, gradient_checkpointing=False).active_variants()


@pytest.fixture(scope="module")
def tiny():
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(), attn_implementation="sdpa")


def test_check_supported_accepts_tiny_llama(tiny):
    check_supported(tiny)


def test_check_supported_refuses(tiny, monkeypatch):
    with pytest.raises(ValueError, match="prefix_grouper.*multimodal"):
        check_supported(tiny, {"pixel_values": torch.zeros(1)})
    with pytest.raises(ValueError, match="prefix_grouper.*aux loss"):
        check_supported(tiny, compute_aux_loss=True)
    monkeypatch.setattr(tiny.config, "_attn_implementation", "flash_attention_2")
    with pytest.raises(ValueError, match="prefix_grouper.*flash_attention_2"):
        check_supported(tiny)


def test_check_supported_refuses_gradient_checkpointing_on_the_model():
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), attn_implementation="eager")
    model.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="prefix_grouper.*checkpointing"):
        check_supported(model)


def test_check_supported_refuses_sliding_window_caches():
    config = MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, sliding_window=4)
    with pytest.raises(ValueError, match="prefix_grouper.*full-attention"):
        check_supported(MistralForCausalLM(config))


def test_check_supported_refuses_models_without_decoder_body():
    class Bare(torch.nn.Module):
        config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                             num_attention_heads=1)

        def get_output_embeddings(self):
            return None

        def get_decoder(self):
            return None

    with pytest.raises(ValueError, match="prefix_grouper.*decoder body"):
        check_supported(Bare())


def _float64_rmsnorm(self, hidden_states):  # LlamaRMSNorm without its float32 round trip (exact float64 test)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def test_grouped_hidden_states_and_grads_equal_standard_forward_in_float64(monkeypatch):
    """The restructured decoder pass is exact: in float64 (with RMSNorm kept in float64, as Llama's casts to
    float32), hidden states and every parameter gradient of a random functional of them agree with the standard
    single forward to 1e-10 (observed ~1e-15), with left-padded prompts of 3 lengths in 3 groups, right-padded
    completions and shuffled rows. sdpa only: eager attention's float32 softmax turns float64's masked scores into
    NaN even in the standard forward. The float32 trainer-level tests (eager and sdpa) are in
    tests/integration/test_prefix_grouper.py."""
    from transformers.models.llama import modeling_llama

    from trl_groupx.memory.prefix_grouper import grouped_hidden_states

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _float64_rmsnorm)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), attn_implementation="sdpa").double().train()
    decoder = model.get_decoder()
    g = torch.Generator().manual_seed(0)
    keep = 6
    ids = torch.zeros(9, 8 + keep, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for group, n in enumerate((8, 5, 2)):
        prompt = torch.randint(3, 104, (n,), generator=g)
        for r in range(3 * group, 3 * group + 3):
            length = int(torch.randint(1, keep + 1, (1,), generator=g))
            ids[r, 8 - n : 8], mask[r, 8 - n : 8] = prompt, 1
            ids[r, 8 : 8 + length], mask[r, 8 : 8 + length] = torch.randint(3, 104, (length,), generator=g), 1
    perm = torch.randperm(9, generator=g)
    ids, mask = ids[perm], mask[perm]
    weights = torch.randn(9, keep, 64, generator=g, dtype=torch.float64) * mask[:, -keep:, None]

    def run(fn):
        model.zero_grad(set_to_none=True)
        hidden = fn()
        (hidden * weights).sum().backward()
        return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want = run(lambda: decoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, -keep - 1 : -1])
    got = run(lambda: grouped_hidden_states(decoder, ids, mask, keep))
    valid = mask[:, -keep:].bool()
    assert not want[0][valid].isnan().any()
    torch.testing.assert_close(got[0][valid], want[0][valid], atol=1e-10, rtol=0)
    assert got[1].keys() == want[1].keys() and len(want[1]) > 30
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=1e-10, rtol=0, msg=name)
