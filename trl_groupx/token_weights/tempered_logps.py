"""Log-probs of the sampled tokens under the rollout policy at other temperatures, from one forward.

Token-weight variants that declare `requires=("tempered_logps",)` (DCPO's target-distribution ratio, `dcpo.py`)
own exactly one `*_temperatures` config field listing the `M` temperatures they need. The trainer runs the model's
ordinary forward once (`fused_lm_head=False`: the model's own logit scaling and soft-capping apply), divides the
completion positions' raw logits by TRL's `temperature` and by each listed temperature, and fills

    TokenContext.logps          = log softmax(z / τ)_{y_t}            (τ = TRL's `temperature`, the loss's)
    TokenContext.entropies      = −Σ_v π_v log π_v  of softmax(z / τ)
    TokenContext.tempered_logps = log softmax(z / T_m)_{y_t}, m = 1..M  `(N, T, M)`, in the field's order

so the variant's ratios `exp(tempered − logps)` compare two temperatures of the same forward. The temperatures
divide the raw logits (not `z / τ`), as verl/EasyR1's `logits.div_(temperature)` does.

Semantics follow TRL's `_get_per_token_logps_and_entropies`: `logits_to_keep` completion positions, micro-batches of
`batch_size` rows, the accelerator's autocast, statistics in float32; positions where `attention_mask` is 0
(completion padding) are 0 in every output and never read. Memory: one micro-batch's `(batch_size, logits_to_keep,
vocab)` logits in the model's dtype plus one row in float32 (`logps_chunk_size` does not apply to this forward).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._full_logits import completion_logit_rows


def logp_temperatures_field(params: Sequence[str]) -> str:
    """The config field (among a variant's `params`) that lists the temperatures of its `tempered_logps`."""
    fields = [p for p in params if p.endswith("_temperatures")]
    if len(fields) != 1:
        raise ValueError(
            f"a variant that requires 'tempered_logps' owns exactly one '*_temperatures' field, got {fields}.")
    return fields[0]


def _check_temperatures(temperatures: Sequence[float]) -> None:
    if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in temperatures):
        raise ValueError(f"temperatures must be finite and positive, got {list(temperatures)}.")


def per_token_logps_at_temperatures(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    temperature: float,
    temperatures: Sequence[float],
    batch_size: int | None = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    **model_inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """No-grad `(logps (N, K), entropies (N, K), tempered_logps (N, K, M))`, float32, of the last `logits_to_keep`
    tokens of `input_ids` (the completion): the first two at `temperature`, the last at each of `temperatures`;
    0 where `attention_mask` is 0. `model_inputs`: the multimodal keys the trainer forwards; only row-indexed ones
    (`token_type_ids`, `mm_token_type_ids`) are supported."""
    _check_temperatures([temperature, *temperatures])
    n, m = input_ids.size(0), len(temperatures)
    if n == 0:
        empty = input_ids.new_zeros((0, logits_to_keep), dtype=torch.float32)
        return empty, empty.clone(), input_ids.new_zeros((0, logits_to_keep, m), dtype=torch.float32)
    all_logps, all_entropies, all_tempered = [], [], []
    rows = completion_logit_rows(
        model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, autocast=autocast,
        feature="log-probs at other temperatures (token weights that require 'tempered_logps', e.g. "
                "token_weighting='dcpo')",
        **model_inputs,
    )
    for labels, keep, z in rows:
        labels = labels[:, None]
        logp_all = torch.log_softmax(z / temperature, dim=-1)
        logps = logp_all.gather(-1, labels).squeeze(-1)
        entropies = -(logp_all.exp() * logp_all).sum(-1)
        tempered = torch.stack(
            [torch.log_softmax(z / t, dim=-1).gather(-1, labels).squeeze(-1) for t in temperatures], dim=-1)
        all_logps.append(torch.where(keep, logps, torch.zeros_like(logps)))
        all_entropies.append(torch.where(keep, entropies, torch.zeros_like(entropies)))
        all_tempered.append(torch.where(keep[:, None], tempered, torch.zeros_like(tempered)))
    return torch.stack(all_logps), torch.stack(all_entropies), torch.stack(all_tempered)
