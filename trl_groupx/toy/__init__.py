"""A tiny, shipped, offline toy setup for GRPO demos and tests.

The package ships ``assets/tiny-arith/``: a 0.27M-parameter Llama-architecture causal LM with a character-level
ChatML tokenizer, built by ``scripts/build_tiny_model.py``: pre-trained on small-integer addition (operands 0..20)
until greedy decoding is right, then flattened (a sampling temperature of 2.75 baked into the final norm) so that
sampling at temperature 1.0 solves only ~28% of the problems. GRPO on CPU (e.g. ``learning_rate=3e-4``,
``per_device_train_batch_size=64``, ``num_generations=8``) then raises the reward from ~0.3 to ~0.6 in ~200 steps.

Example::

    from trl import GRPOConfig, GRPOTrainer
    from trl_groupx.toy import arithmetic_dataset, arithmetic_reward, load_tiny_tokenizer, tiny_model_path

    trainer = GRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=arithmetic_reward,
        train_dataset=arithmetic_dataset(n=4096),
        processing_class=load_tiny_tokenizer(),
        args=GRPOConfig(
            output_dir="out", use_cpu=True, num_generations=8, per_device_train_batch_size=64,
            max_completion_length=8, learning_rate=3e-4, lr_scheduler_type="constant", beta=0.0, max_steps=300,
        ),
    )
    trainer.train()
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TINY_MODEL_DIR",
    "tiny_model_path",
    "load_tiny_model",
    "load_tiny_tokenizer",
    "arithmetic_dataset",
    "arithmetic_reward",
]

#: Folder holding the shipped tiny model and tokenizer (``from_pretrained``-loadable).
TINY_MODEL_DIR: Path = Path(__file__).resolve().parent / "assets" / "tiny-arith"

_INT_RE = re.compile(r"[+-]?\d+")


def tiny_model_path() -> str:
    """Return the shipped tiny model folder as a string (usable as ``GRPOTrainer(model=...)``)."""
    return str(TINY_MODEL_DIR)


def load_tiny_model(dtype: torch.dtype = torch.float32):
    """Load the shipped tiny (Llama-architecture) causal LM from local files only."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY_MODEL_DIR, dtype=dtype, local_files_only=True)


def load_tiny_tokenizer():
    """Load the shipped character-level ChatML tokenizer (left padding, eos ``<|im_end|>``) from local files."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_MODEL_DIR, local_files_only=True)


def _solve(a: int, b: int, op: str) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operator {op!r}; use '+', '-' or '*'")


def arithmetic_dataset(n: int = 256, seed: int = 0, max_operand: int = 20, ops: str = "+"):
    """Deterministic dataset of ``n`` problems ``"a<op>b="`` with ``0 <= a, b <= max_operand``.

    Columns: ``prompt`` (conversational, ``[{"role": "user", "content": "12+7="}]``) and ``answer`` (``"19"``).
    Subtraction is arranged to never go negative. The shipped model was pre-trained on ``ops="+"``,
    ``max_operand=20``; other settings are harder (out of distribution) for it.
    """
    from datasets import Dataset

    for op in ops:
        _solve(0, 0, op)  # validate operators early
    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(n):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a
        prompts.append([{"role": "user", "content": f"{a}{op}{b}="}])
        answers.append(str(_solve(a, b, op)))
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):  # conversational: the assistant turn(s)
        return "".join(_completion_text(m) for m in completion if not isinstance(m, dict) or m.get("role") != "user")
    return str(completion)


def arithmetic_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float | None]:
    """TRL reward function: 1.0 when the stripped completion is exactly the integer ``answer``, else 0.0.

    ``completions`` may be conversational (lists of ``{"role", "content"}`` dicts) or plain strings.
    """
    rewards: list[float | None] = []
    for completion, target in zip(completions, answer, strict=True):
        text = _completion_text(completion).strip()
        ok = bool(_INT_RE.fullmatch(text)) and int(text) == int(str(target).strip())
        rewards.append(1.0 if ok else 0.0)
    return rewards
