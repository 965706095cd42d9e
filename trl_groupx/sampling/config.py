"""Sampling-stage fields of `trl_groupx.GRPOConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingArgs:
    """
    rollout_filter (`str` or `None`, *optional*, defaults to `None`):
        Sampling-stage variant that drops rollouts after generation (a registered id), or `None`.
    """

    rollout_filter: str | None = field(
        default=None, metadata={"help": "Sampling-stage variant id (post-generation filter), or None."}
    )
