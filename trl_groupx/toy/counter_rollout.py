"""A real multi-turn rollout of the counter game through TRL 1.16's public `rollout_func` hook, with the shipped
tiny model as the agent. Used by the step-credit integration test (the model cannot emit TRL tool calls, so the
action is read from its tokens instead).

Each rollout is one episode laid out as TRL lays out a tool-calling episode: `completion_ids` = turn 0 tokens,
observation tokens, turn 1 tokens, ..., last turn tokens, EOS; `env_mask` (TRL's name for a rollout_func tool mask;
it becomes `output["tool_mask"]`) is 1 on the model's tokens and 0 on the observation tokens. A turn is
`turn_tokens` sampled tokens (EOS excluded until the final one); its action is `add(1)` when the first character is
an even digit and `add(2)` otherwise. The extra fields `step_states`, `step_rewards` (one entry per turn, the
`CounterGame` step record) and `outcome` travel with each row: TRL merges them into the row's input dict and
passes them to reward functions (`counter_outcome_reward`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .counter_game import CounterGame


def action_from_text(text: str) -> int:
    return 1 if text[:1].isdigit() and int(text[0]) % 2 == 0 else 2


def make_counter_game_rollout(turn_tokens: int = 2, target: int = 3, max_moves: int = 3) -> Callable:
    """`rollout_func(prompts, trainer) -> dict` playing one counter game per (already G-times repeated) prompt."""

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        tok = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        device = next(model.parameters()).device
        eos = tok.eos_token_id
        out = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "step_states", "step_rewards",
                               "outcome")}
        for prompt in prompts:
            prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
            if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
                prompt_ids = prompt_ids["input_ids"]
            env = CounterGame(target, max_moves)
            env.reset()
            completion, mask = [], []
            while not env.done:
                turn = []
                for j in range(turn_tokens):
                    with torch.no_grad():
                        ids = torch.tensor([list(prompt_ids) + completion + turn], device=device)
                        logits = model(input_ids=ids).logits[0, -1].float() / trainer.temperature
                    logits[eos] = -float("inf")
                    turn.append(int(torch.multinomial(torch.softmax(logits, -1), 1)))
                env.add(action_from_text(tok.decode(turn)))
                completion += turn
                mask += [1] * len(turn)
                if not env.done:
                    obs = tok.encode(f" {env._obs()} ", add_special_tokens=False)
                    completion += obs
                    mask += [0] * len(obs)
            completion.append(eos)
            mask.append(1)
            states, rewards = env._step_structure()
            out["prompt_ids"].append(list(prompt_ids))
            out["completion_ids"].append(completion)
            out["env_mask"].append(mask)
            out["step_states"].append(states[:-1])  # one step per turn; no answer turn after the game here
            out["step_rewards"].append(rewards[:-1])
            out["outcome"].append(env.get_reward())
        out["logprobs"] = None
        return out

    return rollout


def counter_outcome_reward(completions, outcome=None, **kwargs) -> list[float]:
    """Episode reward of the counter game, read from the rollout's `outcome` extra field (a rollout_func field, not a
    dataset column: hence the default, which keeps trl_groupx's dataset-column check from rejecting it)."""
    if outcome is None:
        raise ValueError("counter_outcome_reward needs the `outcome` field of make_counter_game_rollout's rollout_func.")
    return [float(o) for o in outcome]
