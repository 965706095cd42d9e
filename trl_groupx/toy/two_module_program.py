"""A two-module LM program run through TRL 1.16's `rollout_func`, with the shipped tiny model as the LM: the module
`plan` is called, then the module `answer` (a `dspy.Module` with two predictors, in miniature). Used by `mmgrpo`
(LM calls grouped by module across the program's rollouts) and its tests and recipe.

Program, per (already G-times repeated) prompt:
    1. `plan`: `plan_tokens` sampled tokens (EOS excluded). The call *parses* when every character is a digit;
       otherwise it is a format failure and the program stops there (an interrupted trajectory, as dspy's
       `bootstrap_trace_data` stops at an `AdapterParseError`), scored −1 (dspy's `format_failure_score`).
    2. `answer`: `answer_tokens` sampled tokens after the plan and a separator. The program scores 1.0 when the
       answer starts with a digit, else 0.0.

Each rollout is one TRL row: `completion_ids` = plan tokens, separator tokens, answer tokens, EOS (the EOS closes
the last call); `env_mask` (it becomes `output["tool_mask"]`) is 0 on the separator, so each call is one turn.
The extra fields `step_modules` (`["plan", "answer"]`, or `["plan"]` when interrupted) and `program_score` travel
with each row: TRL merges them into the row's input dict and passes them to reward functions
(`program_score_reward`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

FORMAT_FAILURE_SCORE = -1.0  # dspy.GRPO's default `format_failure_score`
SEPARATOR = " | "


def score_program(plan_text: str, answer_text: str | None) -> float:
    """The toy program's score: −1 for a plan that does not parse (no answer call), else 1.0 when the answer starts
    with a digit, 0.0 otherwise."""
    if not plan_parses(plan_text):
        return FORMAT_FAILURE_SCORE
    return 1.0 if answer_text and answer_text[0].isdigit() else 0.0


def plan_parses(plan_text: str) -> bool:
    return plan_text.isdigit()


def _sample_call(model, tok, context: list[int], num_tokens: int, temperature: float) -> list[int]:
    """`num_tokens` tokens sampled one at a time after `context` (EOS excluded)."""
    device = next(model.parameters()).device
    out: list[int] = []
    for _ in range(num_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([context + out], device=device)).logits[0, -1].float() / temperature
        logits[tok.eos_token_id] = -float("inf")
        out.append(int(torch.multinomial(torch.softmax(logits, -1), 1)))
    return out


def make_two_module_program_rollout(plan_tokens: int = 2, answer_tokens: int = 2) -> Callable:
    """`rollout_func(prompts, trainer) -> dict` running the plan → answer program once per prompt."""

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        tok = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        separator = tok.encode(SEPARATOR, add_special_tokens=False)
        out = {k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "step_modules", "program_score")}
        for prompt in prompts:
            prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
            if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
                prompt_ids = prompt_ids["input_ids"]
            prompt_ids = list(prompt_ids)
            plan = _sample_call(model, tok, prompt_ids, plan_tokens, trainer.temperature)
            plan_text = tok.decode(plan)
            completion, mask, modules, answer_text = list(plan), [1] * len(plan), ["plan"], None
            if plan_parses(plan_text):
                answer = _sample_call(model, tok, prompt_ids + plan + separator, answer_tokens, trainer.temperature)
                answer_text = tok.decode(answer)
                completion += separator + answer
                mask += [0] * len(separator) + [1] * len(answer)
                modules.append("answer")
            completion.append(tok.eos_token_id)
            mask.append(1)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion)
            out["env_mask"].append(mask)
            out["step_modules"].append(modules)
            out["program_score"].append(score_program(plan_text, answer_text))
        out["logprobs"] = None
        return out

    return rollout


def program_score_reward(completions, program_score=None, **kwargs) -> list[float]:
    """The program's score, read from the rollout's `program_score` extra field (a rollout_func field, not a dataset
    column: hence the default, which keeps trl_groupx's dataset-column check from rejecting it)."""
    if program_score is None:
        raise ValueError("program_score_reward needs the `program_score` field of make_two_module_program_rollout.")
    return [float(s) for s in program_score]
