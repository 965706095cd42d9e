"""Scoring completions that are not the batch's rollouts (ReMax/AAPO baselines, GCPO's injected references) with
the run's own reward functions, without disturbing what the trainer records for the batch."""

from __future__ import annotations

from typing import Any

import torch
from trl.data_utils import is_conversational


def as_completions(trainer: Any, prompts: list[Any], completion_ids: list[list[int]]) -> list[Any]:
    """Decoded completions in the form reward functions receive for these prompts (as TRL decodes them)."""
    texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    if is_conversational({"prompt": prompts[0]}):
        return [[{"role": "assistant", "content": t}] for t in texts]
    return texts


def score_aside(trainer: Any, inputs: list[dict[str, Any]], completion_ids: list[list[int]]) -> torch.Tensor:
    """`(P × len(inputs), K)` rewards of `completion_ids` for the rows `inputs`, gathered across processes (every
    process must call with the same number of rows). Restores afterwards what scoring leaves behind: the batch's
    global reward matrix and the completions-table columns and metrics that reward functions log
    (`log_extra` / `log_metric`), which TRL sizes for the batch's rollouts."""
    prompts = [x["prompt"] for x in inputs]
    completions = as_completions(trainer, prompts, completion_ids)
    saved = trainer._rewards_per_func
    pending_logs = {k: list(v) for k, v in trainer._pending_extra_logs.items()}
    pending_metrics = {k: list(v) for k, v in trainer._pending_metrics.items()}
    try:
        return trainer._calculate_rewards(inputs, prompts, completions, completion_ids)
    finally:
        trainer._rewards_per_func = saved
        trainer._pending_extra_logs.clear()
        trainer._pending_extra_logs.update(pending_logs)
        trainer._pending_metrics.clear()
        trainer._pending_metrics.update(pending_metrics)
