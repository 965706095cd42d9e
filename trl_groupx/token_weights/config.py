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

    > wapo
    wapo_positive_group_scale (`bool`, defaults to `True`): multiply the kept advantages by
        #groups / #groups-with-a-positive-completion, which turns `loss_type="dr_grpo"` into WAPO's official
        normaliser `Σ / (G · max_len · #positive groups)`.

    > stapo
    stapo_prob_threshold (`float`, defaults to `0.002`): τ_p; a positive-advantage token with rollout probability
        below it is a spurious candidate.
    stapo_entropy_quantile (`float`, defaults to `0.75`): q; candidates with entropy below the q-quantile of the
        candidates' entropies (over the batch) are masked.
    stapo_renormalize (`str`, defaults to `"token"`): `"token"` (global token-mean losses such as dapo/cispo),
        `"sequence"` (sequence-mean losses such as grpo) or `"none"`: remove the masked tokens from the normaliser.

    > edge_grpo
    edge_grpo_eps (`float`, defaults to `1e-6`): lower bound on a completion's mean entropy in EDA's division.

    > mu_grpo
    mu_grpo_veto_trigger (`str`, defaults to `"low_prob"`): what starts the veto in a negative-advantage completion
        (the paper's criterion is not public): `"low_prob"` (rollout probability below the threshold) or
        `"high_entropy"` (entropy above the threshold).
    mu_grpo_veto_threshold (`float`, defaults to `0.01`): the trigger's probability (low_prob) or entropy in nats
        (high_entropy).
    mu_grpo_veto_inclusive (`bool`, defaults to `True`): the trigger token itself is vetoed too.
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
    # wapo
    wapo_positive_group_scale: bool = field(
        default=True, metadata={"help": "WAPO: rescale by #groups / #groups with a positive (official normaliser)."}
    )
    # stapo
    stapo_prob_threshold: float = field(default=0.002, metadata={"help": "STAPO: probability threshold τ_p."})
    stapo_entropy_quantile: float = field(
        default=0.75, metadata={"help": "STAPO: entropy quantile q among low-probability positive tokens."}
    )
    stapo_renormalize: str = field(
        default="token", metadata={"help": "STAPO: renormalise over valid tokens: 'token', 'sequence' or 'none'."}
    )
    # edge_grpo
    edge_grpo_eps: float = field(default=1e-6, metadata={"help": "EDGE-GRPO EDA: floor on the mean entropy divisor."})
    # mu_grpo
    mu_grpo_veto_trigger: str = field(
        default="low_prob", metadata={"help": "Mu-GRPO veto trigger (our choice): 'low_prob' or 'high_entropy'."}
    )
    mu_grpo_veto_threshold: float = field(
        default=0.01, metadata={"help": "Mu-GRPO: trigger probability (low_prob) or entropy (high_entropy)."}
    )
    mu_grpo_veto_inclusive: bool = field(default=True, metadata={"help": "Mu-GRPO: veto the trigger token too."})
