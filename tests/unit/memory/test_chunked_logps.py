"""`chunked_token_logps` against the unchunked computation (full logits, one log-softmax), in float32.

The reference is the textbook formula on the whole `(N, V)` logits: `z = softcap·tanh(scale·(hW^T + b)/softcap)/T`,
`log p = log_softmax(z)`, `H = −Σ p log p`. Chunking only changes which rows are computed together, so values and
gradients must agree to float32 rounding (atol 1e-6)."""

import pytest
import torch
from transformers import PretrainedConfig

import trl_groupx
from trl_groupx.memory.chunked_logps import check_supported, chunked_token_logps, logit_transform

N, H, V = 37, 16, 50  # 37 rows: most chunk sizes below do not divide it


def _setup(seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=gen) / H**0.5)  # logits ~ N(0, 1), log-probs ~ −4
        if bias:
            head.bias.copy_(torch.randn(V, generator=gen))
    targets = torch.randint(V, (N,), generator=gen)
    return hidden, head, targets


def _reference(hidden, head, targets, temperature=1.0, logit_scale=1.0, softcap=None):
    z = head(hidden) * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = (z / temperature).log_softmax(-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _grads(hidden, head, logps, entropies, seed=1):
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    params = [hidden, *head.parameters()]
    return torch.autograd.grad((logps * w1).sum() + (entropies * w2).sum(), params)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 16, 37, 100])
@pytest.mark.parametrize(
    "transform", [{}, {"temperature": 0.7}, {"logit_scale": 0.5, "softcap": 3.0, "temperature": 1.3}]
)
def test_values_and_gradients_equal_the_unchunked_computation(chunk_size, transform):
    hidden, head, targets = _setup()
    ref_logps, ref_ent = _reference(hidden, head, targets, **transform)
    logps, ent = chunked_token_logps(hidden, targets, head, chunk_size=chunk_size, compute_entropy=True, **transform)
    torch.testing.assert_close(logps, ref_logps, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=0)
    # The weight gradient sums over rows and chunking reorders that float32 sum: values up to ~5, so an ulp-level
    # relative term (rtol 1e-5) on top of atol 1e-6.
    for got, want in zip(_grads(hidden, head, logps, ent), _grads(hidden, head, ref_logps, ref_ent)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_entropy_only_when_asked_and_logp_gradient_alone():
    hidden, head, targets = _setup(bias=False)
    logps, ent = chunked_token_logps(hidden, targets, head, chunk_size=5)
    assert ent is None and logps.shape == (N,) and logps.dtype == torch.float32
    ref, _ = _reference(hidden, head, targets)
    g, = torch.autograd.grad(logps.sum(), hidden)
    g_ref, = torch.autograd.grad(ref.sum(), hidden)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=0)


def test_no_logits_are_kept_for_backward():
    # Tensors autograd keeps between forward and backward: with chunking only the checkpointed chunks' inputs,
    # whereas the unchunked computation keeps (N, V) logits / log-softmax tensors.
    hidden, head, targets = _setup()
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_token_logps(hidden, targets, head, chunk_size=4, compute_entropy=True)
    assert max(sizes) <= 4 * H  # only each chunk's inputs (hidden rows, targets): no (rows, V) tensor
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _reference(hidden, head, targets)
    assert max(sizes) >= N * V


def test_no_grad_and_empty_inputs():
    hidden, head, targets = _setup()
    with torch.no_grad():
        logps, ent = chunked_token_logps(hidden, targets, head, chunk_size=8, compute_entropy=True)
        ref_logps, ref_ent = _reference(hidden, head, targets)
    torch.testing.assert_close(logps, ref_logps, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=0)
    logps, ent = chunked_token_logps(hidden[:0], targets[:0], head, chunk_size=8, compute_entropy=True)
    assert logps.shape == ent.shape == (0,)
    logps.sum().backward()  # still connected to the graph (all-padding micro-batch)


def test_upcast_runs_the_head_in_float32():
    hidden, head, targets = _setup()
    logps, _ = chunked_token_logps(hidden.bfloat16(), targets, head, chunk_size=8, upcast=True)
    ref, _ = _reference(hidden.bfloat16().float(), head, targets)
    torch.testing.assert_close(logps, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({}, (1.0, None)),
        ({"final_logit_softcapping": 30.0}, (1.0, 30.0)),  # Gemma 2
        ({"logit_scale": 0.0625}, (0.0625, None)),  # Cohere
        ({"output_multiplier": 2.0}, (2.0, None)),
        ({"lm_head_multiplier": 3.0}, (3.0, None)),  # Falcon-H1
        ({"logits_scaling": 8.0}, (0.125, None)),  # Granite divides
    ],
)
def test_logit_transform_reads_the_config_like_trl(attrs, expected):
    assert logit_transform(PretrainedConfig(**attrs)) == expected


def test_config_validation():
    kwargs = {"output_dir": "/tmp/chunked-logps-config", "use_cpu": True, "bf16": False}
    assert trl_groupx.GRPOConfig(**kwargs).logps_chunk_size is None
    assert trl_groupx.GRPOConfig(**kwargs, logps_chunk_size=64).logps_chunk_size == 64
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError, match="logps_chunk_size"):
            trl_groupx.GRPOConfig(**kwargs, logps_chunk_size=bad)


def test_unsupported_models_and_inputs_are_refused():
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    check_supported(LlamaForCausalLM(config))
    with pytest.raises(ValueError, match="logps_chunk_size.*decoder body and LM head"):
        check_supported(LlamaModel(config))  # no LM head
    with pytest.raises(ValueError, match="logps_chunk_size.*multimodal inputs"):
        check_supported(LlamaForCausalLM(config), {"pixel_values": torch.zeros(1)})
    with pytest.raises(ValueError, match="logps_chunk_size.*aux loss"):
        check_supported(LlamaForCausalLM(config), compute_aux_loss=True)

    vlm = torch.nn.Module()  # a model whose config nests its text config (vision-language models)
    vlm.config = PretrainedConfig()
    vlm.config.get_text_config = lambda *a, **k: config
    with pytest.raises(ValueError, match="logps_chunk_size.*multimodal"):
        check_supported(vlm)
