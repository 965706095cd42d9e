"""One no-grad pass over the full next-token logits of a batch's completions, a micro-batch of rows at a time: the
shared loop of the token-weight requirements that need more than the sampled token's log-prob (`sum_pi_squared`,
`tempered_logps`). Each caller reduces a row's `(K, V)` logits to its own per-token statistics right away, so at
most one micro-batch of full logits is alive."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

# model inputs indexed by row that can be sliced with the micro-batch; vision inputs are not (their pixels are
# packed across rows), so the full-logits paths serve text models only
ROW_INPUTS = ("token_type_ids", "mm_token_type_ids")


def completion_logit_rows(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    feature: str,
    batch_size: int | None = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    **model_inputs: Any,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yield, row by row, `(completion ids (K,), keep (K,) bool, float32 logits (K, V))` of the last
    `logits_to_keep` tokens of `input_ids` (the completion), `keep` = `attention_mask` over them; under no grad, one
    forward per `batch_size` rows. `feature` names the requirement in the error for vision inputs."""
    unsupported = sorted(k for k, v in model_inputs.items() if v is not None and k not in ROW_INPUTS)
    if unsupported:
        raise ValueError(f"{feature} is computed for text models only; the batch carries vision inputs {unsupported}.")
    n = input_ids.size(0)
    batch_size = batch_size or n
    first = input_ids.size(1) - logits_to_keep  # (not `-logits_to_keep`: 0 would keep every column)
    completion_ids = input_ids[:, first:]
    completion_mask = attention_mask[:, first:].bool()
    with torch.no_grad():
        for start in range(0, n, batch_size):
            end = min(start + batch_size, n)
            inputs = {"input_ids": input_ids[start:end], "attention_mask": attention_mask[start:end]}
            inputs.update({k: v[start:end] for k, v in model_inputs.items() if v is not None})
            with autocast():
                logits = model(**inputs, logits_to_keep=logits_to_keep + 1, use_cache=False).logits
            # position j predicts token j+1: the completion's logits are the last `logits_to_keep + 1` positions
            # but the last (a model that ignores `logits_to_keep` returns them all; the slice holds)
            logits = logits[:, -(logits_to_keep + 1): -1]
            for row in range(end - start):
                yield completion_ids[start + row], completion_mask[start + row], logits[row].float()
            del logits
