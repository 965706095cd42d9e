"""Curriculum length-budget reward (Train Long, Think Short, arXiv:2508.08940): correctness + length efficiency
w.r.t. a token budget that decays over training + format."""

from __future__ import annotations

import copy
import math
from typing import Any

from ._utils import answer_text, column, completion_text
from .format import TagFormatReward
from .math import math_equal

__all__ = ["CurriculumLengthReward", "budget_schedule", "curriculum_length_reward"]


def budget_schedule(step: int, *, b0: int = 256, gamma: float = 0.7, interval: int = 150, b_min: int = 1,
                    schedule: str = "exponential", max_steps: int | None = None) -> int:
    """Token budget at optimiser step ``step``.

    ``exponential`` (paper): B(t) = max(b_min, floor(b0 · γ^floor(t / T))) with T = ``interval``; the paper's
    b_min is 1 and its runs go 256 → 179 → 125 → 87 (γ = 0.7, T = 150). ``linear`` (the paper's ablation; its exact
    form was not readable, our choice): B(t) = round(b0 − (b0 − b_min) · min(1, t / max_steps)).
    Non-increasing in t, and ends at b_min.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}.")
    if schedule == "exponential":
        return max(b_min, math.floor(b0 * gamma ** (step // interval)))
    if schedule == "linear":
        if not max_steps or max_steps <= 0:
            raise ValueError("budget_schedule(schedule='linear') needs max_steps > 0 (the trainer's max_steps).")
        return max(b_min, round(b0 - (b0 - b_min) * min(1.0, step / max_steps)))
    raise ValueError(f"schedule must be 'exponential' or 'linear', got {schedule!r}.")


class CurriculumLengthReward:
    r"""Length-budget curriculum reward (Hammoud et al., "Train Long, Think Short: Curriculum Learning for
    Efficient Reasoning", arXiv:2508.08940; catalog id ``curriculum_length``):

        R = λ_c · correct + λ_ℓ · R_len(n, B(t)) + λ_f · format
        R_len(n, B) = max(0, 1 − |n − B| / B)          (triangular, peak 1 at n = B, 0 at n = 0 and n ≥ 2B)
        B(t) = max(b_min, floor(B0 · γ^floor(t / T)))  (see :func:`budget_schedule`)

    with ``correct`` ∈ {0, 1} from math-verify (``math_equal``) on the ``<answer>`` content (else the whole text) against the
    ``solution`` column, ``format`` ∈ {0, 1} for ``<think>…</think><answer>…</answer>``, n the number of completion
    tokens (``completion_ids``), and t the optimiser step ``trainer_state.global_step`` that TRL 1.16 passes to every
    reward function (``GRPOTrainer._calculate_rewards``: ``reward_kwargs["trainer_state"] = self.state``). The
    correctness term does not depend on n.

    Paper values (official-code notes: paper §3.3-3.4; the code repo hammoudhasan/curriculum_grpo had no snapshot
    to read): B0 = 256, γ = 0.7, T = 150, final budget 87 reached after 3 decays, λ_c = 0.6, λ_ℓ = 0.3, G = 8,
    triangular R_len. Our choices where the available text is silent: λ_f = 1 − λ_c − λ_ℓ = 0.1; the exact
    triangle above (peak at the budget, zero at 0 and at twice the budget); n counts all completion tokens
    (the paper applies the length term to the thinking trace; tokens of the answer are few); a missing
    ``trainer_state`` (direct calls) means step 0; a ``None`` solution makes the correctness term 0 rather than
    the whole reward ``None`` (length and format still teach). The paper also writes the current budget into the
    prompt; a static dataset cannot, so that part is left to the user's data pipeline.
    """

    __name__ = "curriculum_length_reward"

    def __init__(self, *, b0: int = 256, gamma: float = 0.7, interval: int = 150, b_min: int = 1,
                 schedule: str = "exponential", w_correct: float = 0.6, w_length: float = 0.3,
                 w_format: float = 0.1, answer_tag: str = "answer"):
        if b0 < 1 or b_min < 1 or b_min > b0:
            raise ValueError(f"need 1 <= b_min <= b0, got b0={b0}, b_min={b_min}.")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}.")
        if interval < 1:
            raise ValueError(f"interval must be >= 1 step, got {interval}.")
        if schedule not in ("exponential", "linear"):
            raise ValueError(f"schedule must be 'exponential' or 'linear', got {schedule!r}.")
        self.b0, self.gamma, self.interval, self.b_min, self.schedule = b0, gamma, interval, b_min, schedule
        self.w_correct, self.w_length, self.w_format = w_correct, w_length, w_format
        self.answer_tag = answer_tag
        self._format = TagFormatReward(("think", "answer"))

    def budget(self, step: int, max_steps: int | None = None) -> int:
        return budget_schedule(step, b0=self.b0, gamma=self.gamma, interval=self.interval, b_min=self.b_min,
                               schedule=self.schedule, max_steps=max_steps)

    @staticmethod
    def length_score(n_tokens: int, budget: int) -> float:
        """Triangular R_len: 1 at n = B, linearly down to 0 at n = 0 and at n = 2B."""
        return max(0.0, 1.0 - abs(n_tokens - budget) / budget)

    def bind(self, args: Any) -> CurriculumLengthReward:
        return copy.copy(self)

    def __call__(self, prompts=None, completions=None, completion_ids=None, trainer_state=None,
                 log_metric=None, **kwargs: Any) -> list[float]:
        completions = completions or []
        texts = [completion_text(c) for c in completions]
        n = len(texts)
        if completion_ids is None:
            raise ValueError("curriculum_length_reward needs completion_ids (passed by GRPOTrainer).")
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        max_steps = getattr(trainer_state, "max_steps", None)
        budget = self.budget(step, max_steps)
        if log_metric is not None:
            log_metric("curriculum_length/budget", float(budget))
        correct = math_equal([answer_text(t, self.answer_tag) for t in texts], column(kwargs, "solution", n))
        rewards = []
        for text, ids, ok in zip(texts, completion_ids, correct, strict=True):
            fmt = 1.0 if self._format.check(text) else 0.0
            rewards.append(
                self.w_correct * float(ok or 0.0) + self.w_length * self.length_score(len(ids), budget)
                + self.w_format * fmt
            )
        return rewards


#: Registered instance with the paper's values.
curriculum_length_reward = CurriculumLengthReward()
