"""Advantage stage: group rewards → advantages.

Contract (see `trl_groupx.contracts`): `fn(rewards (N,) | (N, K), group_size, *, <config fields>) -> (N,)`,
vectorised over all groups at once; NaN rewards are excluded from group statistics and get advantage 0.
One module per variant (or per family); importing this package registers them all.
"""

from .aapo import aapo_advantages
from .agentflow import agentflow_step_advantages
from .allneg_aifeedback import allneg_aifeedback_advantages
from .ccpo import ccpo_step_advantages
from .dagrpo import dagrpo_advantages
from .dvao import dvao_advantages
from .ebpo import ebpo_advantages
from .focal_tailmiss import focal_tailmiss_advantages
from .gagpo import gagpo_step_advantages
from .gd2po import gd2po_advantages
from .gigpo import gigpo_step_advantages
from .gopo import gopo_advantages
from .gpg_valid_rescale import gpg_valid_rescale_advantages
from .graphgpo import graphgpo_step_advantages
from .group_norm import TRL_STD_EPS, decoupled_normalized_advantages, group_normalized_advantages
from .grpo_passk import grpo_passk_advantages
from .hgpo import hgpo_step_advantages
from .lm_components import EmbeddingSimilarityScorer, LMJudge
from .mathforge_dgpo import mathforge_dgpo_advantages
from .mc_grpo import mc_grpo_advantages
from .mdp_grpo import mdp_grpo_advantages
from .mmgrpo import mmgrpo_step_advantages
from .mo_grpo import mo_grpo_advantages
from .opo import opo_advantages
from .papo import papo_advantages
from .reinforce_pp import reinforce_pp_advantages
from .reinforce_pp_baseline import reinforce_pp_baseline_advantages
from .remax import remax_advantages
from .rloo import rloo_advantages
from .sign import sign_advantages
from .softmax_grpo import softmax_grpo_advantages
from .spo_single import spo_single_advantages
from .sppo import sppo_advantages
from .std_dial import std_dial_advantages
from .two_grpo import two_grpo_advantages
from .verigate import verigate_advantages

__all__ = [
    "TRL_STD_EPS",
    "EmbeddingSimilarityScorer",
    "LMJudge",
    "aapo_advantages",
    "allneg_aifeedback_advantages",
    "dagrpo_advantages",
    "remax_advantages",
    "mc_grpo_advantages",
    "agentflow_step_advantages",
    "ccpo_step_advantages",
    "gigpo_step_advantages",
    "gagpo_step_advantages",
    "graphgpo_step_advantages",
    "hgpo_step_advantages",
    "decoupled_normalized_advantages",
    "dvao_advantages",
    "ebpo_advantages",
    "focal_tailmiss_advantages",
    "gd2po_advantages",
    "gopo_advantages",
    "gpg_valid_rescale_advantages",
    "group_normalized_advantages",
    "grpo_passk_advantages",
    "mathforge_dgpo_advantages",
    "mdp_grpo_advantages",
    "mmgrpo_step_advantages",
    "mo_grpo_advantages",
    "opo_advantages",
    "papo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "sign_advantages",
    "softmax_grpo_advantages",
    "spo_single_advantages",
    "sppo_advantages",
    "std_dial_advantages",
    "two_grpo_advantages",
    "verigate_advantages",
]
