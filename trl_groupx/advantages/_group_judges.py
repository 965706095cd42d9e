"""User-supplied judges called on the rollouts of selected groups only (SGPO's step judge for all-negative groups,
VeriGate's step PRM for degenerate groups), and the by-name registry that config fields resolve them through.

A judge is a plain callable with a TRL reward function's arguments: `judge(prompts=..., completions=...,
completion_ids=..., **columns)`, where `columns` are the dataset columns of the rows (as TRL passes them to reward
functions) plus whatever the caller adds (VeriGate: `steps`). It returns one entry per row. Recipes resolve
components by registered name only (a recipe never imports code), as `v0_value`'s predictors.

Multi-process: which groups are selected is decided on the gathered (global) rewards, identical on every process;
each process then calls the judge on its own rows of those groups only (`local_selected_rows`) and the callers
gather the results. A process with no selected row does not call the judge but still joins the gather.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Row fields that are not dataset columns (TRL leaves the same ones out of a reward function's keyword arguments).
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")


class NamedJudges:
    """Name → callable registry behind one config field (`flag`)."""

    def __init__(self, flag: str, register_call: str) -> None:
        self.flag = flag
        self.register_call = register_call  # shown in errors: how to register one
        self._judges: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, judge: Callable[..., Any]) -> None:
        """Make `judge` available as `<flag>=name` (replaces an earlier one of the same name)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.register_call}: name must be a non-empty string, got {name!r}.")
        if not callable(judge):
            raise ValueError(f"{self.register_call}({name!r}, ...): the judge must be callable as "
                             "judge(prompts=..., completions=..., completion_ids=..., **columns).")
        self._judges[name] = judge

    def check(self, name: Any) -> None:
        """`ValueError` naming the flag unless `name` is registered."""
        if name is None:
            raise ValueError(f"{self.flag} is not set: name a registered judge (registered: {sorted(self._judges)}); "
                             f"register your own with {self.register_call}(name, fn) before building the config.")
        if name not in self._judges:
            raise ValueError(f"{self.flag}={name!r} is not registered (registered: {sorted(self._judges)}); call "
                             f"{self.register_call}(name, fn) before building the config.")

    def get(self, name: Any) -> Callable[..., Any]:
        self.check(name)
        return self._judges[name]


def local_selected_rows(selected: torch.Tensor, process_index: int, local_n: int) -> list[int]:
    """Local row indices of this process's slice `[process_index·local_n, (process_index+1)·local_n)` of the global
    `(N,)` bool `selected`."""
    start = process_index * local_n
    return torch.nonzero(selected[start:start + local_n].cpu(), as_tuple=False).flatten().tolist()


def call_judge_on_rows(trainer: Any, judge: Callable[..., Any], rows: list[int], output: dict[str, Any],
                       **extra: list[Any]) -> list[Any]:
    """`judge` on the local `rows` of the generation batch: their prompts (`trainer._rollout_inputs`), their decoded
    completions (as TRL decodes them for reward functions), their completion token ids (padding dropped) and their
    dataset columns, plus `extra` (one list entry per row in `rows`). Returns the judge's list, checked for length."""
    if not rows:
        return []
    from ..sampling._scoring import as_completions  # lazily: the sampling package imports this one's modules

    inputs = [trainer._rollout_inputs[i] for i in rows]
    mask = output["completion_mask"].bool()
    ids = [output["completion_ids"][i][mask[i]].tolist() for i in rows]
    prompts = [row["prompt"] for row in inputs]
    columns = {key: [row.get(key) for row in inputs] for key in inputs[0] if key not in _NOT_COLUMNS}
    result = list(judge(prompts=prompts, completions=as_completions(trainer, prompts, ids), completion_ids=ids,
                        trainer_state=trainer.state, **columns, **extra))
    if len(result) != len(rows):
        raise ValueError(f"the judge {getattr(judge, '__name__', judge)!r} returned {len(result)} entries for "
                         f"{len(rows)} completions; return exactly one per completion.")
    return result
