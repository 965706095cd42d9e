"""Objective stage: per-token surrogates (what is optimised) and aggregation (how it is normalised), kept apart.

Contract (see `trl_groupx.contracts`): `fn(ctx: ObjectiveContext, *, <config fields>) -> per-token loss (B, T)`.
Aggregation is `aggregate(per_token_loss, mask, mode, ...)`, chosen by `loss_aggregation`.
"""

from .aggregation import AGGREGATIONS, TRL_LOSS_AGGREGATION, aggregate
from .gmpo import gmpo_surrogate
from .surrogates import cispo_surrogate, clipped_surrogate, log_ratio, sapo_surrogate

__all__ = [
    "AGGREGATIONS",
    "TRL_LOSS_AGGREGATION",
    "aggregate",
    "cispo_surrogate",
    "clipped_surrogate",
    "gmpo_surrogate",
    "log_ratio",
    "sapo_surrogate",
]
