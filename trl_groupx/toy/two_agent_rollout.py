"""A two-agent Think–Solve pipeline on the toy arithmetic task through TRL 1.16's public `rollout_func` hook: both
agents are the trained policy under different role prompts (CCPO's sequential Thinker → Solver setting,
`advantage_estimator="ccpo"`).

One rollout is one team episode, laid out as TRL lays out a multi-turn episode:

    completion_ids = [Thinker turn] [HANDOFF, env_mask 0] [Solver turn]

* Thinker (agent 1, `"thinker"`): up to `thinker_tokens` tokens sampled after the prompt: the start of the answer.
  If it samples EOS the episode ends there and the Solver never acts.
* Handoff: the Solver's role prompt `HANDOFF` ("|"), observation tokens (`env_mask` 0, not trained).
* Solver (agent 2, `"solver"`): up to `solver_tokens` tokens sampled after prompt + Thinker turn + handoff, stopping
  at EOS: it completes the team's answer. The team answer is the Thinker's text followed by the Solver's
  (`team_answer`: the handoff removed), scored by the run's reward functions (`two_agent_answer_reward`).
* Counterfactual, the team without the Thinker: the same Solver role prompt on the bare prompt (prompt + handoff,
  no Thinker turn), up to `solver_tokens` tokens: the Solver answers alone, as the official Solver-only run does.
  Its token ids travel as `counterfactual_completion_ids`; the trainer scores them with the same reward functions.

Extra fields per row (TRL merges them into the row's input dict): `step_states` (the token context each turn acted
on), `step_rewards` (zeros), `step_modules` (the agent of each turn) and `counterfactual_completion_ids`.
Tokens are sampled at the trainer's temperature from the full softmax (no top-k/top-p), so the rollout log-probs
TRL recomputes are those of the sampling distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

THINKER = "thinker"
SOLVER = "solver"
#: The Solver's role prompt between the two turns (observation tokens, not trained).
HANDOFF = "|"


def _sample(model: Any, context: list[int], max_tokens: int, eos: int, temperature: float) -> list[int]:
    """Up to `max_tokens` tokens sampled after `context`, stopping after EOS (included)."""
    device = next(model.parameters()).device
    out: list[int] = []
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([context + out], device=device)).logits[0, -1].float()
        out.append(int(torch.multinomial(torch.softmax(logits / temperature, -1), 1)))
        if out[-1] == eos:
            break
    return out


def make_two_agent_rollout(thinker_tokens: int = 1, solver_tokens: int = 4) -> Callable:
    """`rollout_func(prompts, trainer) -> dict` running one Thinker → Solver episode and one Solver-only
    counterfactual per (already G-times repeated) prompt."""
    if thinker_tokens < 1 or solver_tokens < 1:
        raise ValueError("thinker_tokens and solver_tokens must be >= 1.")

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        tok = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        eos, temperature = tok.eos_token_id, trainer.temperature
        handoff = tok.encode(HANDOFF, add_special_tokens=False)
        out = {k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "step_states", "step_rewards",
                               "step_modules", "counterfactual_completion_ids")}
        for prompt in prompts:
            prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
            if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
                prompt_ids = prompt_ids["input_ids"]
            prompt_ids = list(prompt_ids)
            thought = _sample(model, prompt_ids, thinker_tokens, eos, temperature)
            completion, mask = list(thought), [1] * len(thought)
            states, modules = [tuple(prompt_ids)], [THINKER]
            if thought[-1] != eos:  # the Thinker handed over: the Solver completes the answer
                context = prompt_ids + thought + handoff
                answer = _sample(model, context, solver_tokens, eos, temperature)
                completion += handoff + answer
                mask += [0] * len(handoff) + [1] * len(answer)
                states.append(tuple(context))
                modules.append(SOLVER)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion)
            out["env_mask"].append(mask)
            out["step_states"].append(states)
            out["step_rewards"].append([0.0] * len(states))
            out["step_modules"].append(modules)
            out["counterfactual_completion_ids"].append(
                _sample(model, prompt_ids + handoff, solver_tokens, eos, temperature))
        out["logprobs"] = None
        return out

    return rollout


def team_answer(text: str) -> str:
    """The team's answer in a decoded completion: the Thinker's text and the Solver's, the handoff removed (a
    Solver-only counterfactual has no handoff and is its own answer)."""
    return text.replace(HANDOFF, "", 1)


def two_agent_answer_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 when the team answer (`team_answer`) is exactly the integer `answer`, else 0.0 (the toy verifier)."""
    from . import _completion_text, arithmetic_reward

    return arithmetic_reward([team_answer(_completion_text(c)) for c in completions], answer)
