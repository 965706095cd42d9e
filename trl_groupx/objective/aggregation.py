"""Aggregation: how a `(B, T)` per-token loss becomes a scalar, kept apart from the surrogate."""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["sequence_mean", "token_mean", "global_token_mean", "constant", "sequence_sum"]
AGGREGATIONS: tuple[str, ...] = ("sequence_mean", "token_mean", "global_token_mean", "constant", "sequence_sum")

# TRL's loss types (grpo_trainer.py `_compute_loss`) and the aggregation each one implies.
TRL_LOSS_AGGREGATION: dict[str, str] = {
    "grpo": "sequence_mean",
    "sapo": "sequence_mean",
    "bnpo": "token_mean",
    "dr_grpo": "constant",
    "dapo": "global_token_mean",
    "cispo": "global_token_mean",
    "vespo": "global_token_mean",
    "luspo": "sequence_sum",
}


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_num_tokens: float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Reduce a `(B, T)` per-token loss to a scalar.

    - `sequence_mean`: `mean_i (Σ_t l_it m_it / max(1, Σ_t m_it))` (GRPO, SAPO, GMPO).
    - `token_mean`: `Σ l m / max(1, Σ m)` over the micro-batch (BNPO).
    - `global_token_mean`: `Σ l m / global_num_tokens` where the caller passes the active-token count of the
      accumulation window on this process (DAPO, CISPO).
    - `constant`: `Σ l m / (B · max_completion_length)` (Dr. GRPO).
    - `sequence_sum`: `mean_i Σ_t l_it m_it` (LUSPO).
    """
    per_token_loss = per_token_loss * mask
    if mode == "sequence_mean":
        return (per_token_loss.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "token_mean":
        return per_token_loss.sum() / mask.sum().clamp(min=1.0)
    if mode == "global_token_mean":
        if global_num_tokens is None:
            raise ValueError("aggregate(mode='global_token_mean') needs global_num_tokens.")
        return per_token_loss.sum() / global_num_tokens
    if mode == "constant":
        if max_completion_length is None:
            raise ValueError("aggregate(mode='constant') needs max_completion_length.")
        return per_token_loss.sum() / (per_token_loss.size(0) * max_completion_length)
    if mode == "sequence_sum":
        return per_token_loss.sum(-1).mean()
    raise ValueError(f"Unknown loss_aggregation {mode!r}; expected one of {AGGREGATIONS}.")


def resolved_aggregation(config) -> str:
    """The normaliser the trainer applies for `config.loss_type`: TRL's own for TRL's loss types, else
    `loss_aggregation` or the objective's paper default."""
    from ..registry import get_variant

    if config.loss_type in TRL_LOSS_AGGREGATION:
        return TRL_LOSS_AGGREGATION[config.loss_type]
    return config.loss_aggregation or get_variant(config.loss_type).flags.get("loss_aggregation", "sequence_mean")
