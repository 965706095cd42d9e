"""Token-weight stage: sequence advantages → per-token advantages `(N, T)`.

Contract (see `trl_groupx.contracts`): `fn(advantages (N,), ctx: TokenContext, *, <config fields>) -> (N, T)`.
The trainer calls it once per generation batch on the global batch (groups intact), with rollout-policy
log-probs and entropies (detached); the result replaces `advantages` and flows into every loss type, since TRL's
losses accept `(B, T)` advantages. Padding never enters a statistic.
"""

from .belief_probe import belief_probe_token_advantages
from .blockwise_adv import blockwise_adv_token_advantages
from .d3s_token import d3s_token_advantages
from .dcpo import dcpo_token_advantages
from .edge_grpo import edge_grpo_token_advantages
from .frpo import frpo_token_advantages
from .gcpo_guidance import gcpo_guidance_token_advantages
from .gtpo import gtpo_token_advantages
from .gtpo_conflict import gtpo_conflict_token_advantages
from .hapo import hapo_token_advantages
from .lopti import lopti_token_advantages
from .mu_grpo import mu_grpo_token_advantages
from .nat import nat_token_advantages
from .otb import otb_token_advantages
from .rs_grpo import rs_grpo_token_advantages
from .rto import rto_token_advantages
from .s_grpo_tspmo import s_grpo_tspmo_token_advantages
from .spo_segment import spo_segment_token_advantages
from .stapo import stapo_token_advantages
from .temporal_credit import temporal_credit_token_advantages
from .tw_grpo import tw_grpo_token_advantages
from .verigate_step import verigate_step_token_advantages
from .wapo import wapo_token_advantages

__all__ = [
    "gtpo_token_advantages",
    "wapo_token_advantages",
    "frpo_token_advantages",
    "stapo_token_advantages",
    "edge_grpo_token_advantages",
    "mu_grpo_token_advantages",
    "hapo_token_advantages",
    "lopti_token_advantages",
    "gtpo_conflict_token_advantages",
    "d3s_token_advantages",
    "temporal_credit_token_advantages",
    "nat_token_advantages",
    "otb_token_advantages",
    "blockwise_adv_token_advantages",
    "rs_grpo_token_advantages",
    "s_grpo_tspmo_token_advantages",
    "gcpo_guidance_token_advantages",
    "tw_grpo_token_advantages",
    "verigate_step_token_advantages",
    "dcpo_token_advantages",
    "rto_token_advantages",
    "belief_probe_token_advantages",
    "spo_segment_token_advantages",
]
