"""PAPO: outcome advantage over the whole group plus a process advantage normalised among correct responses only
(Process-Aware Policy Optimization; official code tanzelin430/PAPO)."""

from __future__ import annotations

import math

import torch

from ..registry import register
from ._checks import reject_infinite
from ._process_rewards import check_reward_indices, grouped_columns, masked_group_zscore, outcome_and_process_columns

# Official `epsilon` default: added to the std, and the threshold below which a group's std counts as zero.
PAPO_EPS = 1e-6


def _validate(config) -> None:
    check_reward_indices(config, "papo")
    if not math.isfinite(config.papo_process_weight) or config.papo_process_weight < 0:
        raise ValueError(
            f"papo_process_weight (λ in A = A_out + λ·A_proc) must be a finite number ≥ 0 (paper 1.0; 0 is plain "
            f"GRPO), got {config.papo_process_weight}."
        )
    if not math.isfinite(config.papo_correct_threshold):
        raise ValueError(
            f"papo_correct_threshold must be finite (a response is correct when its outcome reward ≥ it; 1.0 for a "
            f"0/1 verifier), got {config.papo_correct_threshold}."
        )


@register(
    "papo",
    name="PAPO (Process-Aware Policy Optimization)",
    paper="Stabilizing Rubric Integration Training via Decoupled Advantage Normalization (PAPO), arXiv:2603.26535",
    official_code="tanzelin430/PAPO@277dac1cfe29d465ad9aee0499b4869b698d2e97:verl/verl/trainer/ppo/core_algos.py",
    stage="advantages",
    flags={"advantage_estimator": "papo", "papo_outcome_reward_index": 0, "papo_process_reward_index": 1,
           "papo_process_weight": 1.0, "papo_correct_threshold": 1.0},
    params=("papo_outcome_reward_index", "papo_process_reward_index", "papo_process_weight", "papo_correct_threshold"),
    needs=(("two reward_funcs: the outcome verifier and a process reward model / judge (one float per completion), "
            "at papo_outcome_reward_index and papo_process_reward_index"),),
    requires=("rewards_per_func",),
    validate=_validate,
)
def papo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    papo_outcome_reward_index: int = 0,
    papo_process_reward_index: int = 1,
    papo_process_weight: float = 1.0,
    papo_correct_threshold: float = 1.0,
) -> torch.Tensor:
    r"""PAPO: `A_i = A_out,i + λ · A_proc,i`.

    With `o` the outcome-verifier column and `p` the process-reward (PRM / rubric judge) column of the per-function
    reward matrix, per group of `G` responses:

    - `A_out,i = (o_i − mean_g o) / (std_g o + ε)` over all scored responses of the group; 0 for the whole group
      when `std_g o ≤ ε` (all-equal) or fewer than two responses are scored;
    - `C = {i : o_i ≥ papo_correct_threshold}` the correct responses; `A_proc,i = (p_i − mean_C p) / (std_C p + ε)`
      for `i ∈ C`, and `A_proc,i = 0` for incorrect responses, and for every response when fewer than two correct
      responses are scored by the PRM or `std_C p ≤ ε`;
    - `λ = papo_process_weight` (official default 1.0; 0.6 in the Qwen2.5-7B script), `ε = 1e-6`, std unbiased.

    So incorrect responses get only the outcome advantage; among correct ones the PRM ranks the reasoning; an
    all-correct group (no outcome signal) still gets a gradient through `A_proc`.

    Shapes: `rewards (N, K)` (the trainer passes the per-function matrix because of `requires=("rewards_per_func",)`;
    `K ≥ 2`, else a `ValueError` naming the flags); a `(N,)` vector is read as the outcome column alone (no process
    term, i.e. GRPO with the official ε handling) → `(N,)`.

    Citation: arXiv:2603.26535 (catalog row `papo`, seed 004_65d2611f32946cb1.txt ¶90: "A_out from the outcome
    verifier normalised over all responses; A_proc from a rubric-based PRM normalised only among correct responses
    (0 for incorrect)"), and
    the official code tanzelin430/PAPO@277dac1cfe29d465ad9aee0499b4869b698d2e97:
    verl/verl/trainer/ppo/core_algos.py:compute_grpo_dual_objective_advantage, l.333-480 (A_out l.403-412:
    zero unless `std > ε`; A_proc l.414-434: `num_correct ≥ 2` and `std > ε`, correct = `score == 1.0`; combine
    l.436-437 with a fixed λ; the same formula in roll/utils/functionals.py:compute_grpo_dual_advantage).
    official-code.md notes the scripts' `lambda_safety` is never read, so correct answers can get `A < 0` (an
    all-correct group with process scores [1, .5, .5, 0] gets [1.22, 0, 0, −1.22]); we follow the code (no clip).

    Choices the paper/abstract leave open, with ours: the combination is the official fixed-λ sum; correctness is
    `o ≥ papo_correct_threshold` (default 1.0 = the official `== 1.0` for a 0/1 verifier; the official code can
    also read a separate `acc` column, which we do not have); TRL's `reward_weights` are not applied (the columns
    are read raw; λ is the weight); NaN handling (the official code has none): a response whose outcome is NaN gets
    advantage 0 and is left out of both statistics; a correct response whose process score is NaN keeps its
    `A_out`, gets `A_proc = 0` and is left out of the process statistics; ±inf raises. The official code's
    optional Dr. GRPO switch (`norm_adv_by_std_in_grpo=False`) is not exposed. What the PRM is (the paper: a rubric
    judge scoring 0 / 0.5 / 1) is the user's reward function; `trl_groupx.rewards.arithmetic_prefix_prm` is a tiny
    rule-based stand-in for the toy task.

    Args:
        rewards (`torch.Tensor`): `(N, K)` per-function rewards (NaN where unscored).
        group_size (`int`): `G`.
        papo_outcome_reward_index (`int`): column of the outcome verifier in `reward_funcs`.
        papo_process_reward_index (`int`): column of the process reward model / judge.
        papo_process_weight (`float`): λ ≥ 0.
        papo_correct_threshold (`float`): a response is correct when its outcome reward is ≥ this.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "papo")
    outcome, process = outcome_and_process_columns(rewards, papo_outcome_reward_index, papo_process_reward_index,
                                                   "papo")
    o, p = grouped_columns(outcome, process, group_size)  # (B, G)
    scored = ~torch.isnan(o)
    a_out = masked_group_zscore(o, scored, PAPO_EPS, min_std=PAPO_EPS)
    correct = scored & (o >= papo_correct_threshold) & ~torch.isnan(p)
    a_proc = masked_group_zscore(p, correct, PAPO_EPS, min_std=PAPO_EPS)
    return (a_out + papo_process_weight * a_proc).reshape(-1)
