"""A rule-based per-step process reward for the toy arithmetic task (tests and recipe of `token_weighting=
"verigate_step"`): one score per reasoning step instead of one per completion, so it is not a TRL reward function."""

from __future__ import annotations

from typing import Any

from ._utils import column

__all__ = ["arithmetic_step_prm"]


def arithmetic_step_prm(prompts=None, completions=None, steps=None, **kwargs: Any) -> list[list[float] | None]:
    """First-error step scores against the reference answer: step `k` scores 1.0 when the completion's text up to the
    end of step `k` (steps concatenated, as written) is a prefix of the ``answer`` column, else 0.0; so the scores
    are 1 up to the step holding the first wrong character and 0 from there on. A row without a reference answer
    gets ``None`` (unscored). ``steps`` is the list of step texts of each completion (VeriGate's step split).

    A stand-in for a learned PRM on a task whose steps are digits; pass your own step PRM in real runs.
    """
    answers = column(kwargs, "answer", len(steps))
    scores: list[list[float] | None] = []
    for row_steps, answer in zip(steps, answers, strict=True):
        target = None if answer is None else str(answer).strip()
        if not target:
            scores.append(None)
            continue
        written, row = "", []
        for step in row_steps:
            written += step
            row.append(1.0 if target.startswith(written) else 0.0)
        scores.append(row)
    return scores
