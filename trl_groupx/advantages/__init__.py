"""Advantage stage: group rewards → advantages.

Contract (see `trl_groupx.contracts`): `fn(rewards (N,) | (N, K), group_size, *, <config fields>) -> (N,)`,
vectorised over all groups at once; NaN rewards are excluded from group statistics and get advantage 0.
One module per variant (or per family); importing this package registers them all.
"""

from .group_norm import TRL_STD_EPS, decoupled_normalized_advantages, group_normalized_advantages
from .sign import sign_advantages

__all__ = ["TRL_STD_EPS", "decoupled_normalized_advantages", "group_normalized_advantages", "sign_advantages"]
