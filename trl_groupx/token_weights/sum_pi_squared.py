"""Per-token Σ_v π_v² of the rollout policy, with the sampled tokens' log-probs and the entropies, in one forward.

TRL's `_get_per_token_logps_and_entropies` runs a fused LM head that returns only log-probs and entropies, and the
collision probability Σ_v π_v² cannot be derived from those two. Token-weight variants that declare
`requires=("sum_pi_squared",)` (OTB's logit-gradient proxy, `otb.py`) get all three from this function instead:
the model's ordinary forward (`fused_lm_head=False`, so the model's own logit scaling and soft-capping apply), the
logits of the completion positions divided by TRL's `temperature`, and

    logp_t = z_{y_t} − logsumexp(z),   H_t = −Σ_v π_v log π_v,   Σπ²_t = exp(logsumexp(2z) − 2·logsumexp(z))

(the last as verl's `calculate_sum_pi_squared_from_logits`, volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7:
verl/utils/torch_functional.py l.680–694, applied there to the temperature-divided logits, verl/workers/actor/
dp_actor.py l.259 and l.281–287).

Semantics follow TRL's method: `logits_to_keep` completion positions, micro-batches of `batch_size` rows, the
accelerator's autocast, statistics in float32; positions where `attention_mask` is 0 (completion padding) are 0 in
all three outputs and never read. Memory: one micro-batch's `(batch_size, logits_to_keep, vocab)` logits in the
model's dtype plus one row in float32 (`logps_chunk_size` does not apply to this forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ._full_logits import completion_logit_rows


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """`Σ_v softmax(logits)_v²` over the last axis, as `exp(logsumexp(2z) − 2·logsumexp(z))` (verl's form)."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def _row_statistics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp of `labels`, entropy, Σπ²) of `(T, V)` float32 logits."""
    lse = torch.logsumexp(logits, dim=-1)
    logp_all = logits - lse[:, None]
    logps = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1)
    sum_sq = torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * lse)
    return logps, entropies, sum_sq


def per_token_logps_entropies_sum_pi_squared(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    temperature: float,
    batch_size: int | None = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    **model_inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """No-grad `(logps, entropies, sum_pi_squared)`, each `(N, logits_to_keep)` float32, of the last
    `logits_to_keep` tokens of `input_ids` (the completion) under `model` at `temperature`; 0 where
    `attention_mask` is 0. `model_inputs`: the multimodal keys the trainer forwards; only row-indexed ones
    (`token_type_ids`, `mm_token_type_ids`) are supported."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    n = input_ids.size(0)
    all_logps, all_entropies, all_sum_sq = [], [], []
    rows = completion_logit_rows(
        model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, autocast=autocast,
        feature="Σπ² per token (token weights that require 'sum_pi_squared', e.g. token_weighting='otb')",
        **model_inputs,
    )
    for labels, keep, logits in rows:
        stats = _row_statistics(logits / temperature, labels)
        for acc, value in zip((all_logps, all_entropies, all_sum_sq), stats):
            acc.append(torch.where(keep, value, torch.zeros_like(value)))
    if n == 0:
        empty = input_ids.new_zeros((0, logits_to_keep), dtype=torch.float32)
        return empty, empty.clone(), empty.clone()
    return torch.stack(all_logps), torch.stack(all_entropies), torch.stack(all_sum_sq)
