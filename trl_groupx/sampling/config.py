"""Sampling-stage fields of `trl_groupx.GRPOConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingArgs:
    """
    rollout_filter (`str` or `None`, *optional*, defaults to `None`):
        Sampling-stage variant that drops rollouts after generation (a registered id), or `None`.
    gfpo_keep (`int`, *optional*, defaults to `8`):
        GFPO: responses kept per group, `k < num_generations` (paper: 8 of 16).
    gfpo_metric (`str`, *optional*, defaults to `"length"`):
        GFPO: `"length"` keeps the k shortest, `"reward_per_token"` the k with the largest reward / length.
    gfpo_adaptive (`bool`, *optional*, defaults to `False`):
        GFPO: Adaptive Difficulty GFPO, k per group from its success rate (fixed bins; see `sampling/gfpo.py`).
    gfpo_adaptive_keep (`str`, *optional*, defaults to `"8,8,6,4"`):
        GFPO adaptive: comma-separated k for group success rate in [0, .25), [.25, .5), [.5, .75), [.75, 1]
        (paper: 8 8 6 4).
    d3s_keep_start (`float`, *optional*, defaults to `0.5`):
        D³S sample level: fraction of each group kept at step 0 (aggressive down-sampling early; our choice).
    d3s_keep_end (`float`, *optional*, defaults to `1.0`):
        D³S sample level: fraction kept at the last step (linear schedule; 1.0 ends at plain GRPO; our choice).
    dapo_max_gen_batches (`int`, *optional*, defaults to `10`):
        DAPO dynamic sampling: most generation batches per training batch (the first included) while refilling
        zero-variance groups; 0 = no cap (verl's `max_num_gen_batches`, DAPO script: 10). When reached, the missing
        groups are zero-variance ones, masked out (verl raises instead).
    """

    rollout_filter: str | None = field(
        default=None, metadata={"help": "Sampling-stage variant id (post-generation filter), or None."}
    )
    gfpo_keep: int = field(default=8, metadata={"help": "GFPO: responses kept per group (k < num_generations)."})
    gfpo_metric: str = field(
        default="length", metadata={"help": "GFPO ranking: 'length' (shortest) or 'reward_per_token' (largest)."}
    )
    gfpo_adaptive: bool = field(default=False, metadata={"help": "GFPO: k per group from its success rate."})
    gfpo_adaptive_keep: str = field(
        default="8,8,6,4",
        metadata={"help": "GFPO adaptive: comma-separated k for success rate in [0,.25), [.25,.5), [.5,.75), [.75,1]"},
    )
    d3s_keep_start: float = field(default=0.5, metadata={"help": "D3S: fraction of each group kept at step 0."})
    d3s_keep_end: float = field(default=1.0, metadata={"help": "D3S: fraction of each group kept at the last step."})
    dapo_max_gen_batches: int = field(
        default=10, metadata={"help": "DAPO dynamic sampling: max generation batches per training batch (0 = no cap)."}
    )
