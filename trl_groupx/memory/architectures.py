"""Architecture constants the memory planner needs, for shipped model names, config.json files and model folders.

Every shipped entry copies the fields of the model's published `config.json` on the Hugging Face Hub
(`https://huggingface.co/<name>/blob/main/config.json`): hidden size, layers, attention heads, key/value heads,
head dimension, MLP intermediate size, vocabulary, tied embeddings, `max_position_embeddings` (what vLLM uses as
`max_model_len` when `vllm_max_model_length` is unset) and the checkpoint dtype. Only dense decoder-only models
with the Llama/Qwen layout (q/k/v/o projections, gated MLP with three matrices) are modelled; mixture-of-experts
configs are rejected with a clear error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Architecture:
    """The shape of a dense decoder-only transformer (Llama/Qwen layout)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int = 32768
    qkv_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head (adds q+kv saved elements per token and layer)
    torch_dtype: str = "bfloat16"
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the seven projections of one layer: `H·q + 2H·kv + q·H + 3H·I` (facts §4.2 (1))."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return h * q + 2 * h * kv + q * h + 3 * h * i

    @property
    def linear_params(self) -> int:
        """`P_lin`: the parameters bitsandbytes quantises (the decoder layers' linear weights)."""
        return self.num_layers * self.linear_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding plus, for untied models, the separate `lm_head`."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        """`P`: linear weights + embeddings/head + biases + norms."""
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        per_layer_extra = 2 * h  # two RMSNorm weights
        if self.qkv_bias:
            per_layer_extra += q + 2 * kv
        if self.qk_norm:
            per_layer_extra += 2 * self.head_dim
        return self.linear_params + self.num_layers * per_layer_extra + self.embedding_params + h

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 KV-cache bytes per token: `2·L·kv·2` (facts §4.2 (6))."""
        return 2 * self.num_layers * self.kv_dim * 2


_HUB = "https://huggingface.co/{}/blob/main/config.json"


def _arch(name, h, layers, heads, kv, head_dim, inter, vocab, tied, max_pos, *, qkv_bias=False, qk_norm=False,
          dtype="bfloat16") -> Architecture:
    return Architecture(
        name=name, hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=max_pos,
        qkv_bias=qkv_bias, qk_norm=qk_norm, torch_dtype=dtype, source=_HUB.format(name),
    )


def _qwen2(name, h, layers, heads, kv, inter, vocab, tied, max_pos):
    return _arch(name, h, layers, heads, kv, h // heads, inter, vocab, tied, max_pos, qkv_bias=True)


def _qwen3(name, h, layers, heads, inter, tied):
    return _arch(name, h, layers, heads, 8, 128, inter, 151936, tied, 40960, qk_norm=True)


_ENTRIES = [
    # Qwen2.5 (qkv bias, tied embeddings up to 3B)
    _qwen2("Qwen/Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, 32768),
    _qwen2("Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 131072),
    _qwen2("Qwen/Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True, 32768),
    _qwen2("Qwen/Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, 131072),
    _qwen2("Qwen/Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 4864, 151936, True, 32768),
    _qwen2("Qwen/Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 8960, 151936, True, 32768),
    _qwen2("Qwen/Qwen2.5-3B-Instruct", 2048, 36, 16, 2, 11008, 151936, True, 32768),
    _qwen2("Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, False, 32768),
    _qwen2("Qwen/Qwen2.5-Math-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 4096),
    _qwen2("Qwen/Qwen2.5-Math-7B", 3584, 28, 28, 4, 18944, 152064, False, 4096),
    _qwen2("Qwen/Qwen2.5-Math-1.5B-Instruct", 1536, 28, 12, 2, 8960, 151936, True, 4096),
    _qwen2("Qwen/Qwen2.5-Math-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, False, 4096),
    _qwen2("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1536, 28, 12, 2, 8960, 151936, False, 131072),
    _qwen2("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 3584, 28, 28, 4, 18944, 152064, False, 131072),
    # Qwen3 (head_dim 128, 8 KV heads, q/k norm; 8B unties the head)
    _qwen3("Qwen/Qwen3-0.6B", 1024, 28, 16, 3072, True),
    _qwen3("Qwen/Qwen3-1.7B", 2048, 28, 16, 6144, True),
    _qwen3("Qwen/Qwen3-4B", 2560, 36, 32, 9728, True),
    _qwen3("Qwen/Qwen3-8B", 4096, 36, 32, 12288, False),
    _qwen3("Qwen/Qwen3-0.6B-Base", 1024, 28, 16, 3072, True),
    _qwen3("Qwen/Qwen3-1.7B-Base", 2048, 28, 16, 6144, True),
    _qwen3("Qwen/Qwen3-4B-Base", 2560, 36, 32, 9728, True),
    _qwen3("Qwen/Qwen3-8B-Base", 4096, 36, 32, 12288, False),
    # Llama 3.x (vocab 128256; 3.2 ties the head)
    _arch("meta-llama/Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, 128256, True, 131072),
    _arch("meta-llama/Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, 128256, True, 131072),
    _arch("meta-llama/Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, 128256, False, 131072),
    _arch("meta-llama/Llama-3.2-1B-Instruct", 2048, 16, 32, 8, 64, 8192, 128256, True, 131072),
    _arch("meta-llama/Llama-3.2-3B-Instruct", 3072, 28, 24, 8, 128, 8192, 128256, True, 131072),
    _arch("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 32, 8, 128, 14336, 128256, False, 131072),
    # Others used by the facts file's reported runs
    _arch("meta-llama/Llama-2-7b-hf", 4096, 32, 32, 32, 128, 11008, 32000, False, 4096, dtype="float16"),
    _arch("mistralai/Mistral-7B-v0.3", 4096, 32, 32, 8, 128, 14336, 32768, False, 32768),
    _arch("mistralai/Mistral-7B-Instruct-v0.3", 4096, 32, 32, 8, 128, 14336, 32768, False, 32768),
    _arch("microsoft/phi-4", 5120, 40, 40, 10, 128, 17920, 100352, False, 16384),
]

KNOWN_MODELS: dict[str, Architecture] = {a.name: a for a in _ENTRIES}


def _lookup_key(name: str) -> str:
    return name.strip().lower()


_BY_KEY: dict[str, Architecture] = {}
for _a in _ENTRIES:
    _BY_KEY[_lookup_key(_a.name)] = _a
    _BY_KEY.setdefault(_lookup_key(_a.name.split("/", 1)[1]), _a)  # the name without its organisation


_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def architecture_from_config(config: dict, name: str = "config.json") -> Architecture:
    """Constants from a `config.json` dict (multimodal configs: their `text_config`)."""
    if "text_config" in config and "hidden_size" not in config:
        config = config["text_config"]
    moe = [k for k in _MOE_KEYS if config.get(k)]
    if moe:
        raise ValueError(f"{name}: mixture-of-experts config ({', '.join(moe)}); the planner only models dense "
                         f"decoder-only models.")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "vocab_size") if k not in config]
    if missing:
        raise ValueError(f"{name}: config.json lacks {missing}; the planner needs a decoder-only LM config.")
    h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    model_type = str(config.get("model_type", ""))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").replace("torch.", "")
    return Architecture(
        name=name,
        hidden_size=h,
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or h // heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        # transformers' Llama/Qwen configs default to untied heads
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(config.get("max_position_embeddings") or 32768),
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type.startswith("qwen3"),
        torch_dtype=dtype,
        source=name,
    )


def resolve_architecture(model: str | os.PathLike | Architecture | dict) -> Architecture:
    """An `Architecture` from a shipped name, a `config.json` path, a local model folder, or a config dict.

    Raises `ValueError` naming the fix for unknown names.
    """
    if isinstance(model, Architecture):
        return model
    if isinstance(model, dict):
        return architecture_from_config(model)
    path = os.fspath(model)
    if os.path.isdir(path):
        cfg = os.path.join(path, "config.json")
        if not os.path.isfile(cfg):
            raise ValueError(f"model folder {path!r} has no config.json; pass the folder of a downloaded model.")
        path = cfg
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            arch = architecture_from_config(json.load(f), name=path)
        return replace(arch, source=path)
    arch = _BY_KEY.get(_lookup_key(path))
    if arch is None:
        raise ValueError(
            f"unknown model {path!r}: the planner ships constants for {len(KNOWN_MODELS)} models "
            f"(`trl-groupx plan --list_models`). Pass the path of its config.json or of a local model folder "
            f"instead, e.g. `huggingface-cli download {path} config.json --local-dir cfg` then `--model cfg`."
        )
    return arch
