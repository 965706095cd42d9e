"""Counterfactual rollouts (CCPO): the reward of each episode's run without the credited agent, scored by the run's
own reward functions.

The rollout_func generates the counterfactual itself (only it knows the pipeline: for the Think–Solve pipeline, the
Solver alone on the bare prompt) and returns its token ids per row as the extra field
`counterfactual_completion_ids`; TRL merges that field into each row's input dict. The trainer decodes them as it
decodes the rollouts, scores them with the same reward functions, keyword columns and weights
(`sampling/_scoring.score_aside`), and hands the advantage stage a global `(N,)` tensor aligned with the rollouts
(requirement `counterfactual_rewards`).
"""

from __future__ import annotations

from typing import Any

import torch

from ._scoring import score_aside

COUNTERFACTUAL_FIELD = "counterfactual_completion_ids"


def check_counterfactual_rollouts(trainer: Any, variant_id: str) -> None:
    """Trainer-construction refusal: only a rollout_func can produce the counterfactual runs."""
    if getattr(trainer, "rollout_func", None) is None:
        raise ValueError(
            f"advantage_estimator={variant_id!r} compares each episode's team outcome with a counterfactual run "
            "without the credited agent: pass a rollout_func that returns, per episode, `step_modules` (the agent of "
            f"each turn) and `{COUNTERFACTUAL_FIELD}` (the pipeline's output without that agent), e.g. "
            "trl_groupx.toy.two_agent_rollout.make_two_agent_rollout()."
        )


def counterfactual_rewards(trainer: Any, inputs: list[dict[str, Any]], variant_id: str) -> torch.Tensor:
    """Global `(N,)` float32 weighted reward of every row's counterfactual completion (CPU); NaN where no reward
    function scored it. Every process calls it with its own rows (same count everywhere)."""
    missing = [i for i, row in enumerate(inputs) if COUNTERFACTUAL_FIELD not in row]
    if missing:
        raise ValueError(
            f"advantage_estimator={variant_id!r}: rows {missing[:5]} carry no `{COUNTERFACTUAL_FIELD}`; return it "
            "from your rollout_func (one list of token ids per row: the pipeline's output without the credited agent)."
        )
    per_func = score_aside(trainer, inputs, [list(row[COUNTERFACTUAL_FIELD]) for row in inputs])
    weights = trainer.reward_weights.to(per_func.device)
    rewards = (per_func * weights).nansum(dim=1)
    rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
    return rewards.float().cpu()
