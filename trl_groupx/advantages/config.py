"""Advantage-stage fields of `trl_groupx.GRPOConfig`: the selector, then one block per variant's hyper-parameters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdvantageArgs:
    """
    advantage_estimator (`str`, *optional*, defaults to `"grpo"`):
        Advantage-stage variant. `"grpo"` keeps TRL's computation (`scale_rewards`, `multi_objective_aggregation`).
    """

    advantage_estimator: str = field(
        default="grpo", metadata={"help": "Advantage-stage variant id; 'grpo' keeps TRL's own computation."}
    )
