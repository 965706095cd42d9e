"""SGPO's all-negative-group rescue: a step-wise judge scores the wrong responses of groups in which every response
is wrong, and those scores replace that group's rewards before GRPO's normalisation (Stepwise Guided Policy
Optimization, arXiv:2505.11595; no public code).

The judge is a component the user supplies, registered by name (recipes resolve components by registered name only):

    from trl_groupx.advantages.allneg_aifeedback import register_allneg_judge
    register_allneg_judge("my_judge", my_step_judge)       # (prompts, completions, **columns) -> scores in [0, 1]
    GRPOConfig(advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="my_judge", ...)

`"arithmetic_prefix"` (built in) is a rule-based toy judge for the shipped arithmetic task: the share of the
reference answer a completion gets right from the left (`trl_groupx.rewards.arithmetic_prefix_prm`).

A model-backed judge, as the paper uses, is `LMJudge` (`trl_groupx/advantages/lm_components.py`): the judge LM's
next-token `P(yes) / (P(yes) + P(no))` after a documented question template, a score in `[0, 1]` as this variant
expects; register one (`register_allneg_judge("my_judge", LMJudge.from_pretrained(path))`) or, from a recipe,
name a model: `allneg_aifeedback_judge: "lm_judge:<model folder or hub id>"` (built with the defaults on first use).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..registry import register
from ..rewards.arithmetic_prm import arithmetic_prefix_prm
from ._checks import reject_infinite
from ._group_judges import call_judge_on_rows, local_selected_rows
from .group_norm import group_normalized_advantages
from .lm_components import MODEL_JUDGE_PREFIX, LMJudge, ModelNamedJudges

VARIANT_ID = "allneg_aifeedback"
JUDGE_FLAG = "allneg_aifeedback_judge"

# `lm_judge:<model>` names an LM judge built from that model on first use (recipes cannot register one).
JUDGES = ModelNamedJudges(JUDGE_FLAG, "trl_groupx.advantages.allneg_aifeedback.register_allneg_judge",
                          MODEL_JUDGE_PREFIX, LMJudge.from_pretrained)
register_allneg_judge = JUDGES.register
register_allneg_judge("arithmetic_prefix", arithmetic_prefix_prm)


def _validate(config) -> None:
    JUDGES.check(config.allneg_aifeedback_judge)
    threshold = config.allneg_aifeedback_fail_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        raise ValueError(f"allneg_aifeedback_fail_threshold must be a finite number (a response is wrong when its "
                         f"reward is <= it; 0.0 for a 0/1 verifier), got {threshold!r}.")
    for flag in ("num_generations", "num_generations_eval"):
        g = getattr(config, flag, None)
        if g is not None and g < 2:
            raise ValueError(f"advantage_estimator='allneg_aifeedback' compares the responses of a group: {flag}={g} "
                             "leaves one response per group; use num_generations >= 2.")


def all_negative_groups(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """`(N/G,)` bool: groups with at least one scored response and every scored reward `<= threshold` (NaN =
    unscored, ignored)."""
    grouped = rewards.view(-1, group_size)
    scored = ~torch.isnan(grouped)
    right = scored & (grouped > threshold)
    return scored.any(dim=1) & ~right.any(dim=1)


def rows_to_judge(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """`(N,)` bool: the scored responses of the all-negative groups, the only rows the judge sees."""
    return all_negative_groups(rewards, group_size, threshold).repeat_interleave(group_size) & ~torch.isnan(rewards)


@register(
    VARIANT_ID,
    name="SGPO (Stepwise Guided Policy Optimization): step-judge rescue of all-negative groups",
    paper="Stepwise Guided Policy Optimization: Coloring your Incorrect Reasoning in GRPO, arXiv:2505.11595",
    official_code=None,
    stage="advantages",
    # The toy judge makes the flags runnable on the shipped arithmetic task; a real run names its own judge.
    flags={"advantage_estimator": VARIANT_ID, JUDGE_FLAG: "arithmetic_prefix", "allneg_aifeedback_fail_threshold": 0.0},
    params=(JUDGE_FLAG, "allneg_aifeedback_fail_threshold"),
    needs=(("a step-wise judge registered with register_allneg_judge and named by allneg_aifeedback_judge: "
            "(prompts, completions, **columns) -> one score in [0, 1] per (wrong) completion"),),
    requires=("judge_scores",),
    validate=_validate,
)
def allneg_aifeedback_advantages(
    rewards: torch.Tensor, group_size: int, *, judge_scores: torch.Tensor | None = None,
    allneg_aifeedback_fail_threshold: float = 0.0, scale_rewards: str = "group",
) -> torch.Tensor:
    r"""GRPO whose all-negative groups are re-scored by a step-wise judge.

    Per group `g` of `G` responses with rewards `r_i` (the weighted sum of the reward functions):

    - the group is *all-negative* when it has a scored response and every scored `r_i ≤ τ`
      (`τ = allneg_aifeedback_fail_threshold`, 0 for a 0/1 verifier: "wrong" is "no better than the failure value");
    - all-negative group: `r̃_i = j_i`, the judge's score of response `i` in `[0, 1]` (`judge_scores`); any other
      group: `r̃_i = r_i` (its rewards are untouched and the judge never sees it);
    - `A_i = (r̃_i − mean_g r̃) / (std_g r̃ + 1e-4)`: GRPO's advantage exactly as TRL computes it
      (`group_normalized_advantages`, TRL's `scale_rewards`), so a batch without an all-negative group gets
      GRPO's numbers bit for bit.

    Shapes: `rewards (N,)`, `judge_scores (N,)` (NaN where the judge was not called or returned `None`) → `(N,)`.

    Citation: arXiv:2505.11595 (abstract: "incorporating response diversity within groups using a step-wise judge
    model" for "all-negative-sample groups"; catalog row `allneg_aifeedback`, seed 004_65d2611f32946cb1.txt ¶83;
    official-code.md: no code, "step judge only for all-negative groups; judge scores correct-prefix length of
    wrong answers"). The paper's method section was not readable here (only its abstract pages), so:

    Choice: the judged reward is the judge's score itself, `r̃_i = j_i ∈ [0, 1]`, read as the share of the response
    that is a correct prefix (the step judge's first-error position over the number of steps, for a judge that
    returns it); no rescaling against the correct-answer reward (with `scale_rewards="group"` the z-score makes the
    scale irrelevant inside the group; with `"batch"`/`"none"` the judged rewards enter the batch as they are).
    Choice: "wrong" = reward `≤ τ` on the weighted reward sum (exact equality to the failure value would miss a
    group with format penalties below it). Choice: a response whose reward is NaN (no reward function scored it)
    is not judged and keeps advantage 0; a NaN judge score (the judge returned `None`) gives that response advantage
    0 and leaves it out of the group statistics. Choice: evaluation batches are not judged (the trainer passes
    NaN scores there): their all-negative groups get GRPO's 0, as the advantages do not train.

    Edge cases: `G = 1` raises (there is no group to compare; also refused at config construction); `G = 2` works
    (two judged responses get ±0.7071 unless their scores tie); ±inf rewards raise; a judge score outside `[0, 1]`
    raises naming `allneg_aifeedback_judge`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups contiguous, NaN where unscored.
        group_size (`int`): `G`.
        judge_scores (`torch.Tensor`, *optional*): `(N,)` judge scores on the rows of the all-negative groups
            (`rows_to_judge`), NaN elsewhere; filled by the trainer (requirement `judge_scores`). `None`: no rescue.
        allneg_aifeedback_fail_threshold (`float`): `τ`.
        scale_rewards (`str`): TRL's `scale_rewards`.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    if group_size < 2:
        raise ValueError("advantage_estimator='allneg_aifeedback' needs groups of at least two responses "
                         f"(group_size={group_size}); use num_generations >= 2.")
    reject_infinite(rewards, VARIANT_ID)
    rescued = rewards.clone()
    if judge_scores is not None:
        judged = rows_to_judge(rewards, group_size, allneg_aifeedback_fail_threshold)
        scores = judge_scores.to(rewards)
        bad = judged & ~torch.isnan(scores) & ((scores < 0) | (scores > 1))
        if bad.any():
            raise ValueError(f"{JUDGE_FLAG}: the judge returned {scores[bad].tolist()[:5]}; scores must lie in [0, 1] "
                             "(None for a response it cannot score).")
        rescued = torch.where(judged, scores, rewards)
    return group_normalized_advantages(rescued, group_size, scale_rewards=scale_rewards)


def judge_scores_for_batch(trainer: Any, output: dict[str, Any], rewards: torch.Tensor,
                           group_size: int) -> torch.Tensor:
    """Trainer glue of requirement `judge_scores`: global `(N,)` float32 scores, the judge's on the responses of the
    all-negative groups (decided on the global `rewards`), NaN elsewhere. Each process judges its own rows only and
    the scores are gathered; nothing is judged (and nothing gathered) when no group is all-negative or in
    evaluation. Logs the share of judged groups."""
    threshold = trainer.args.allneg_aifeedback_fail_threshold
    scores = torch.full((rewards.numel(),), float("nan"), dtype=torch.float32)
    if not trainer.model.training:
        return scores
    selected = rows_to_judge(rewards.cpu(), group_size, threshold)
    groups = all_negative_groups(rewards.cpu(), group_size, threshold)
    trainer._metrics["train"]["groupx/allneg_judged_group_fraction"].append(groups.float().mean().item())
    if not selected.any():  # the same decision on every process: nobody gathers
        return scores
    acc = trainer.accelerator
    local_n = output["completion_ids"].size(0)
    rows = local_selected_rows(selected, acc.process_index, local_n)
    judged = call_judge_on_rows(trainer, JUDGES.get(trainer.args.allneg_aifeedback_judge), rows, output)
    local = torch.full((local_n,), float("nan"), dtype=torch.float32)
    for row, score in zip(rows, judged, strict=True):
        local[row] = float("nan") if score is None else float(score)
    if acc.num_processes > 1:
        local = acc.gather(local.to(acc.device)).cpu()
    return local
