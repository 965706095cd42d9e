"""Reward functions as the trainer calls them: their inputs are checked at construction, their outputs at every call.

TRL turns a reward function's bad output into an error deep inside `torch.tensor` (a string), or silently into NaN
advantages that poison the whole update (±inf). The trainer wraps each plain (synchronous, non-model) reward
function so that such output, or an exception inside the function, fails at once with the function's name and the
fix. Values pass through unchanged: training numbers are TRL's.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

# Keyword arguments TRL 1.16's `_calculate_rewards` passes besides the dataset columns.
TRL_REWARD_KWARGS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


def missing_reward_columns(fn: Callable[..., Any], columns: Iterable[str]) -> list[str]:
    """Required parameters of `fn` that neither TRL nor the dataset (`columns`) will supply."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and C callables: nothing to check
        return []
    available = TRL_REWARD_KWARGS | set(columns)
    return [
        p.name for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in available
    ]


def check_reward_columns(reward_funcs, names, columns: Iterable[str] | None) -> None:
    """Raise `ValueError` naming the reward function and the column when the training dataset lacks one it needs."""
    if columns is None:  # an iterable dataset without declared columns: checked at the first call instead
        return
    columns = list(columns)
    for fn, name in zip(reward_funcs, names):
        if not callable(fn) or _is_module(fn):
            continue
        missing = missing_reward_columns(fn, columns)
        if missing:
            raise ValueError(
                f"reward function {name!r} needs the dataset column(s) {missing}, which train_dataset lacks "
                f"(columns: {columns}). Add the column(s) to the dataset, or give those parameters a default."
            )


def _is_module(fn: Any) -> bool:
    import torch.nn as nn

    return isinstance(fn, nn.Module)


def checked_reward(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn` wrapped so that an exception names the reward function and a non-numeric or infinite reward is a
    `ValueError` naming the function, the completion and the fix. `None` and NaN pass (TRL: "no score")."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            rewards = fn(*args, **kwargs)
        except Exception as err:
            raise RuntimeError(
                f"reward function {name!r} raised {type(err).__name__}: {err}. Fix the function, or return None "
                "for the completions it cannot score (they get advantage 0)."
            ) from err
        if isinstance(rewards, (str, bytes)) or not hasattr(rewards, "__len__"):
            raise ValueError(
                f"reward function {name!r} returned {type(rewards).__name__}; it must return a list with one "
                "float (or None) per completion."
            )
        for i, value in enumerate(rewards):
            if value is None:
                continue
            if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # numpy / torch scalars
                value = value.item()
            if not isinstance(value, numbers.Real):  # bools pass, as TRL accepts them
                raise ValueError(
                    f"reward function {name!r} returned {value!r} ({type(value).__name__}) for completion {i}; "
                    "rewards must be numbers, or None for 'no score'."
                )
            if math.isinf(value):
                raise ValueError(
                    f"reward function {name!r} returned {value} for completion {i}; rewards must be finite "
                    "(return None for 'no score': that completion gets advantage 0)."
                )
        return rewards

    return wrapper


def wrap_reward_funcs(reward_funcs: list[Any], names: list[str]) -> list[Any]:
    """Each plain synchronous reward function wrapped by `checked_reward`; model and async rewards unchanged."""
    out = []
    for fn, name in zip(reward_funcs, names):
        plain = callable(fn) and not _is_module(fn) and not inspect.iscoroutinefunction(fn)
        plain = plain and not inspect.iscoroutinefunction(getattr(fn, "__call__", None))
        out.append(checked_reward(fn, name) if plain else fn)
    return out
