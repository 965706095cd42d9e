"""Token-weight-stage fields of `trl_groupx.GRPOConfig`: the selector, then one block per variant."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenWeightArgs:
    """
    token_weighting (`str` or `None`, *optional*, defaults to `None`):
        Token-weight-stage variant turning sequence advantages into per-token advantages, or `None`.

    > gtpo_entropy
    gtpo_level (`str`, defaults to `"token"`): `"token"` (GTPO) or `"sequence"` (GRPO-S).
    gtpo_alpha1 (`float`, defaults to `1.0`): GTPO α1 / GRPO-S β1, the outcome term.
    gtpo_alpha2 (`float`, defaults to `0.1`): GTPO α2 / GRPO-S β2, the entropy term.
    gtpo_normalization (`str`, defaults to `"separate"`): GTPO Eq. 6: `"separate"` z-scores the tokens of successful
        and failed completions apart; `"joint"` uses one z-score over all tokens.
    gtpo_success_threshold (`float`, defaults to `0.0`): a completion is successful when its reward exceeds it.
    """

    token_weighting: str | None = field(
        default=None, metadata={"help": "Token-weight-stage variant id, or None for sequence-level advantages."}
    )
    # gtpo_entropy
    gtpo_level: str = field(default="token", metadata={"help": "GTPO: 'token' (GTPO) or 'sequence' (GRPO-S)."})
    gtpo_alpha1: float = field(default=1.0, metadata={"help": "GTPO: outcome weight α1 (GRPO-S β1)."})
    gtpo_alpha2: float = field(default=0.1, metadata={"help": "GTPO: entropy weight α2 (GRPO-S β2)."})
    gtpo_normalization: str = field(
        default="separate", metadata={"help": "GTPO Eq. 6: 'separate' (success/failure apart) or 'joint'."}
    )
    gtpo_success_threshold: float = field(
        default=0.0, metadata={"help": "GTPO: a completion is successful when its reward exceeds this."}
    )
