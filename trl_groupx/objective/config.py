"""Objective-stage fields of `trl_groupx.GRPOConfig` (the selector is TRL's own `loss_type`), one block per variant."""

from __future__ import annotations

from dataclasses import dataclass, field

from .aggregation import AGGREGATIONS


@dataclass
class ObjectiveArgs:
    """
    loss_aggregation (`str` or `None`, *optional*, defaults to `None`):
        Normaliser for a trl_groupx objective: `"sequence_mean"`, `"token_mean"`, `"global_token_mean"`,
        `"constant"` or `"sequence_sum"`. `None` uses the objective's paper default. TRL's loss types fix their own.

    > gmpo
    gmpo_clip (`float`, defaults to `0.4`): GMPO's log-space clip `c`.
    """

    loss_aggregation: str | None = field(
        default=None,
        metadata={"help": f"Normaliser for trl_groupx objectives, one of {AGGREGATIONS}; None = paper default."},
    )
    # gmpo
    gmpo_clip: float = field(default=0.4, metadata={"help": "GMPO: log-space clip c of each token log-ratio."})
