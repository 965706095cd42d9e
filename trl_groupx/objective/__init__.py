"""Objective stage: per-token surrogates (what is optimised) and aggregation (how it is normalised), kept apart.

Contract (see `trl_groupx.contracts`): `fn(ctx: ObjectiveContext, *, <config fields>) -> per-token loss (B, T)`.
Aggregation is `aggregate(per_token_loss, mask, mode, ...)`, chosen by `loss_aggregation`.
"""

from .aggregation import AGGREGATIONS, TRL_LOSS_AGGREGATION, aggregate, balanced_sequence_scale, resolved_aggregation
from .balanced_agg import balanced_agg_surrogate
from .ctpo import ctpo_surrogate
from .dgrpo import dgrpo_surrogate
from .dhpo import dhpo_surrogate
from .dppo import dppo_kl_surrogate, dppo_tv_surrogate
from .dro import dro_surrogate
from .dual_clip import dual_clip_surrogate
from .entropy_cov import clip_cov_surrogate, kl_cov_surrogate
from .fiberpo import fiberpo_surrogate
from .gmpo import gmpo_surrogate
from .gvpo import gvpo_surrogate
from .hapo_clip import hapo_clip_bounds, hapo_clip_surrogate
from .holderpo import holderpo_p, holderpo_surrogate
from .kl import KL_ESTIMATORS, per_token_kl
from .lightningrl import lightningrl_surrogate, nll_anchor_weights
from .offpolicy_grpo import offpolicy_grpo_surrogate
from .reinforce import reinforce_surrogate
from .srpo import srpo_surrogate
from .surrogates import TRL_REFERENCE_SURROGATE, cispo_surrogate, clipped_surrogate, log_ratio, sapo_surrogate
from .thinkless import thinkless_surrogate

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "TRL_REFERENCE_SURROGATE",
    "TRL_LOSS_AGGREGATION",
    "aggregate",
    "balanced_agg_surrogate",
    "balanced_sequence_scale",
    "cispo_surrogate",
    "clip_cov_surrogate",
    "clipped_surrogate",
    "ctpo_surrogate",
    "dgrpo_surrogate",
    "dro_surrogate",
    "lightningrl_surrogate",
    "nll_anchor_weights",
    "dhpo_surrogate",
    "dppo_kl_surrogate",
    "dppo_tv_surrogate",
    "dual_clip_surrogate",
    "fiberpo_surrogate",
    "gmpo_surrogate",
    "gvpo_surrogate",
    "hapo_clip_bounds",
    "hapo_clip_surrogate",
    "holderpo_p",
    "holderpo_surrogate",
    "kl_cov_surrogate",
    "log_ratio",
    "offpolicy_grpo_surrogate",
    "per_token_kl",
    "reinforce_surrogate",
    "resolved_aggregation",
    "sapo_surrogate",
    "srpo_surrogate",
    "thinkless_surrogate",
]
