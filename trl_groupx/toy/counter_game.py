"""A tiny deterministic multi-turn environment for step-credit tests: the counter game.

The counter starts at 0; each turn the agent adds 1 or 2 (`add(amount)`); reaching exactly `target` wins
(step reward 1, episode reward 1), overshooting loses (reward 0), and the episode also ends after `max_moves`
moves. The observation is the counter value, so identical values across the episodes of a group are the
anchor states GiGPO groups by, and the sequence of values is the history HGPO groups by. Every number is
computable by hand (see tests/unit/advantages/test_step_credit.py).

The class follows TRL 1.16's `environment_factory` protocol (`GRPOTrainer(environment_factory=CounterGame)`):
`reset(**row) -> str`, public methods are the tools (here `add`), `get_reward() -> float`. It also records the
step structure that TRL itself does not keep: `_step_states[t]` is the observation the agent saw before its turn
`t` and `_step_rewards[t]` the reward of that turn, one entry per model turn (the last turn, which answers after
the final tool result, acts on the final state with reward 0). `_step_structure()` returns them (private, so TRL
does not expose it as a tool); `StepBatch.from_lists` turns a batch of them into the tensors the step-credit
functions take.
"""

from __future__ import annotations

from collections.abc import Sequence


class CounterGame:
    """Counter game, `target` 3 and at most 3 moves by default."""

    def __init__(self, target: int = 3, max_moves: int = 3) -> None:
        self.target = target
        self.max_moves = max_moves
        self.reset()

    def reset(self, **kwargs) -> str:
        self.value = 0
        self.moves = 0
        self.done = False
        self._step_states: list[str] = [self._obs()]
        self._step_rewards: list[float] = []
        return self._obs()

    def _obs(self) -> str:
        return f"counter={self.value}"

    def add(self, amount: int) -> str:
        """Add 1 or 2 to the counter.

        Args:
            amount: How much to add, 1 or 2.

        Returns:
            The new counter value, and whether the game is over.
        """
        if self.done:
            raise ValueError("The game is over.")
        if amount not in (1, 2):
            raise ValueError("amount must be 1 or 2.")
        self.value += amount
        self.moves += 1
        reward = 1.0 if self.value == self.target else 0.0
        self.done = self.value >= self.target or self.moves >= self.max_moves
        self._step_rewards.append(reward)
        self._step_states.append(self._obs())
        return self._obs() + (" (game over)" if self.done else "")

    def get_reward(self) -> float:
        return 1.0 if self.value == self.target else 0.0

    def _step_structure(self) -> tuple[list[str], list[float]]:
        """(states, rewards), one entry per model turn: every tool call plus the final answer turn."""
        return list(self._step_states), [*self._step_rewards, 0.0]


def play(moves: Sequence[int], target: int = 3, max_moves: int = 3) -> tuple[list[str], list[float], float]:
    """Play a scripted episode; returns (per-turn states, per-turn rewards, episode reward). Moves after the game is
    over are ignored (as a policy whose tool calls are rejected would have to stop)."""
    env = CounterGame(target, max_moves)
    env.reset()
    for m in moves:
        if env.done:
            break
        env.add(m)
    states, rewards = env._step_structure()
    return states, rewards, env.get_reward()
