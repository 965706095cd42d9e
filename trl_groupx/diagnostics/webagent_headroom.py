"""Headroom probe: sampled-minus-greedy success before GRPO training (catalog id ``webagent_headroom``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

__all__ = ["HeadroomProbe", "measure_headroom"]


def _prompt_text(prompt: Any, tokenizer: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


@torch.no_grad()
def measure_headroom(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    reward_func: Callable[..., list[float | None]],
    *,
    num_samples: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    success_threshold: float = 0.5,
    seed: int = 0,
) -> dict[str, float]:
    """Greedy and sampled success of ``model`` on ``rows`` (dataset rows with a ``prompt`` and the reward's columns).

    For every prompt: one greedy completion and ``num_samples`` completions at ``temperature``; a completion
    succeeds when ``reward_func`` (TRL signature) gives a reward > ``success_threshold`` (``None`` rewards are left
    out). Returns ``greedy_success``, ``sampled_success`` (means over completions) and ``headroom`` =
    sampled − greedy, the condition of "GRPO on SFT web agents" (001 ¶0 line 1): GRPO helped only where the sampled
    policy already succeeded more often than the greedy one.
    """
    if num_samples < 1 or temperature <= 0:
        raise ValueError("measure_headroom: need num_samples >= 1 and temperature > 0.")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts = [row["prompt"] for row in rows]
    texts = [_prompt_text(p, tokenizer) for p in prompts]
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        common = {"max_new_tokens": max_new_tokens, "pad_token_id": pad_id}
        greedy = model.generate(**enc, do_sample=False, **common)
        torch.manual_seed(seed)
        sampled = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                 num_return_sequences=num_samples, **common)
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    width = enc["input_ids"].size(1)

    def success(outputs: torch.Tensor, repeat: int) -> float:
        ids = [_strip(seq[width:].tolist(), tokenizer) for seq in outputs]
        decoded = [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
        rep_prompts = [p for p in prompts for _ in range(repeat)]
        completions = [
            d if isinstance(p, str) else [{"role": "assistant", "content": d}] for p, d in zip(rep_prompts, decoded)
        ]
        columns = {k: [row[k] for row in rows for _ in range(repeat)] for k in rows[0] if k != "prompt"}
        rewards = reward_func(prompts=rep_prompts, completions=completions, completion_ids=ids, **columns)
        scored = [float(r) > success_threshold for r in rewards if r is not None]
        return sum(scored) / len(scored) if scored else float("nan")

    greedy_success = success(greedy, 1)
    sampled_success = success(sampled, num_samples)
    return {"greedy_success": greedy_success, "sampled_success": sampled_success,
            "headroom": sampled_success - greedy_success}


def _strip(ids: list[int], tokenizer: Any) -> list[int]:
    """Completion ids up to and including the first eos, padding dropped."""
    out = []
    for token in ids:
        if token == tokenizer.pad_token_id and token != tokenizer.eos_token_id:
            continue
        out.append(token)
        if token == tokenizer.eos_token_id:
            break
    return out


class HeadroomProbe(TrainerCallback):
    """``transformers.TrainerCallback`` that measures sampled-minus-greedy success once, before the first step, and
    logs it through the Trainer (``headroom/greedy_success``, ``headroom/sampled_success``, ``headroom/headroom``),
    so it reaches every ``report_to`` integration. A diagnostic for the headroom condition of the web-agent GRPO
    study (catalog ``webagent_headroom``): where headroom ≤ 0, plain GRPO has little to sharpen.

    Usage::

        probe = HeadroomProbe(rows=eval_rows, reward_func=my_success_reward, num_samples=8)
        trainer.add_callback(probe.bind(trainer))   # bind: log through trainer.log (else only probe.metrics)

    ``temperature`` defaults to the trainer's sampling temperature when bound. The result is kept in
    ``probe.metrics``. Choices (the study's exact evaluation protocol is not in the abstract): success = reward
    > 0.5; one greedy and ``num_samples`` sampled completions per prompt, plain HF ``generate`` (no vLLM).
    """

    def __init__(self, rows: Sequence[dict[str, Any]], reward_func: Callable[..., list[float | None]], *,
                 num_samples: int = 8, temperature: float | None = None, max_new_tokens: int | None = None,
                 success_threshold: float = 0.5, seed: int = 0):
        if not rows:
            raise ValueError("HeadroomProbe: give at least one row.")
        self.rows = list(rows)
        self.reward_func = reward_func
        self.num_samples = num_samples
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.success_threshold = success_threshold
        self.seed = seed
        self.metrics: dict[str, float] | None = None
        self._trainer: Any = None

    def bind(self, trainer: Any) -> HeadroomProbe:
        self._trainer = trainer
        return self

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.metrics is not None or state.global_step > 0:  # once, and not again on resume
            return
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        temperature = self.temperature if self.temperature is not None else float(getattr(args, "temperature", 1.0))
        max_new = self.max_new_tokens or int(getattr(args, "max_completion_length", 64) or 64)
        result = measure_headroom(model, tokenizer, self.rows, self.reward_func, num_samples=self.num_samples,
                                  temperature=temperature, max_new_tokens=max_new,
                                  success_threshold=self.success_threshold, seed=self.seed)
        self.metrics = {f"headroom/{k}": v for k, v in result.items()}
        if self._trainer is not None:
            self._trainer.log(dict(self.metrics))
        else:
            state.log_history.append({**self.metrics, "step": state.global_step})
