"""VeriGate: verifier advantages where the verifier separates the group, process-reward advantages only where it
does not (Verifier-Gated Step-Level GRPO, arXiv:2605.30451; no public code). Outcome-level gating only: see the
step-level credit in `token_weighting="verigate_step"` (`trl_groupx/token_weights/verigate_step.py`)."""

from __future__ import annotations

import torch

from ..registry import register
from ._checks import reject_infinite
from ._process_rewards import check_reward_indices, grouped_columns, masked_group_zscore, outcome_and_process_columns
from .group_norm import TRL_STD_EPS


def _validate(config) -> None:
    check_reward_indices(config, "verigate")


@register(
    "verigate",
    name="VeriGate (Verifier-Gated Step-Level GRPO), outcome-level gating",
    paper="VeriGate: Verifier-Gated Step-Level GRPO, arXiv:2605.30451",
    official_code=None,
    stage="advantages",
    flags={"advantage_estimator": "verigate", "verigate_outcome_reward_index": 0, "verigate_process_reward_index": 1},
    params=("verigate_outcome_reward_index", "verigate_process_reward_index"),
    needs=(("two reward_funcs: the outcome verifier and a process reward model / judge (one float per completion), "
            "at verigate_outcome_reward_index and verigate_process_reward_index"),),
    requires=("rewards_per_func",),
    validate=_validate,
)
def verigate_advantages(
    rewards: torch.Tensor, group_size: int, *, verigate_outcome_reward_index: int = 0,
    verigate_process_reward_index: int = 1,
) -> torch.Tensor:
    r"""VeriGate, outcome-level: the verifier decides wherever it can; the PRM only fills degenerate groups.

    With `o` the verifier column and `p` the process-reward (PRM) column of the per-function reward matrix, per
    group of `G` responses:

    - the group is *degenerate* when its scored verifier rewards are all equal (or fewer than two are scored);
    - non-degenerate group: `A_i = (o_i − mean_g o) / (std_g o + 1e-4)`, TRL's GRPO advantage of the verifier
      column (unbiased std), so a mixed group gets exactly GRPO's advantages and the PRM column is not read;
    - degenerate group: `A_i = (p_i − mean_g p) / (std_g p + 1e-4)` over the responses scored by both functions;
      0 when fewer than two are (or the PRM is constant there, up to the 1e-4).

    Shapes: `rewards (N, K)`, `K ≥ 2` (a `ValueError` naming the flags otherwise); a `(N,)` vector is read as the
    verifier alone (no PRM: degenerate groups stay 0, i.e. GRPO) → `(N,)`.

    Citation: arXiv:2605.30451 (abstract; catalog row `verigate`, seed 001_a802f1d2c360f935.txt ¶0 line 5). There
    is no public code (official-code.md: "normalisation set unknown").

    Step level: the paper's PRM gives one score `s_j` per reasoning step; it turns them into future-cumulated
    rewards `R_k = Σ_{j≥k} s_j` and group-normalises these into *token-level* advantages (tokens of step `k` get the
    normalised `R_k`). That is `token_weighting="verigate_step"` (`trl_groupx/token_weights/verigate_step.py`): a
    token-stage variant, because TRL's reward-function interface returns one float per completion and this
    package's advantage stage returns one advantage per rollout; there the step PRM is a registered component
    called on the degenerate groups only. Here (sequence level) the PRM is one scalar per completion: if your PRM
    reward function returns `Σ_j s_j`, that is `R_1`, the reward-to-go of the first step, and the degenerate-group
    advantage is its group z-score broadcast over the completion. The catalog's check "PRM never called on mixed
    groups" holds only at step level: here TRL calls every reward function on every completion (only its score is
    ignored there).

    Choices the abstract leaves open, with ours: "degenerate" = all scored verifier rewards equal (exact
    equality, the abstract's "same verifier reward"); the normalisation set of the PRM advantages is the
    degenerate group itself (the catalog notes it is unknown) with GRPO's z-score (unbiased std + 1e-4, TRL's
    convention, so both branches have the same scale); TRL's `reward_weights` and `scale_rewards` are not applied
    (the columns are read raw, the z-score is always by the group std). NaN: a response whose verifier reward is
    NaN gets 0 and is left out of both statistics; a response whose PRM score is NaN gets 0 in a degenerate
    group and is left out of its statistics; ±inf raises.

    Args:
        rewards (`torch.Tensor`): `(N, K)` per-function rewards (NaN where unscored).
        group_size (`int`): `G`.
        verigate_outcome_reward_index (`int`): column of the verifier in `reward_funcs`.
        verigate_process_reward_index (`int`): column of the process reward model.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "verigate")
    outcome, process = outcome_and_process_columns(rewards, verigate_outcome_reward_index,
                                                   verigate_process_reward_index, "verigate")
    o, p = grouped_columns(outcome, process, group_size)  # (B, G)
    scored = ~torch.isnan(o)
    high = torch.where(scored, o, torch.full_like(o, -torch.inf)).amax(dim=1, keepdim=True)
    low = torch.where(scored, o, torch.full_like(o, torch.inf)).amin(dim=1, keepdim=True)
    degenerate = ~(high > low)  # all scored verifier rewards equal, or fewer than two scored (then high ≤ low)
    a_out = masked_group_zscore(o, scored, TRL_STD_EPS)
    a_proc = masked_group_zscore(p, scored & ~torch.isnan(p), TRL_STD_EPS)
    return torch.where(degenerate, a_proc, a_out).reshape(-1)
