"""MOTIF's outcome reward for the multi-round rollout (`trl_groupx.rollouts.multi_round`; catalog id `motif`).

Official code: purbeshmitra/MOTIF@4838e9ea876c9a135d9b2737eb05b9c86c362b18:motif.py, `total_reward_func`
(l.196-215): for each future trajectory of a round-1 completion, 2.0 when `\\boxed{<answer>}` occurs in the final
round's `<answer>` text, else 1.0 when it occurs anywhere in the final round's output, else 0.0; the row's reward
is the mean over its futures. A plain substring test, as in the official code (no math equivalence).

The official run adds `xmlcount_reward_func`, `soft_format_reward_func` and `strict_format_reward_func` on the
round-1 completion (tag-format rewards for `<reasoning>`/`<answer>`); add a format reward of your choice for them.
"""

from __future__ import annotations

from typing import Any

from ..rollouts.multi_round import extract_answer

__all__ = ["motif_outcome_reward", "motif_trajectory_score"]


def motif_trajectory_score(final_text: str, answer: str) -> float:
    """2 / 1 / 0 for one final-round output (official l.213)."""
    boxed = f"\\boxed{{{answer}}}"
    if boxed in extract_answer(final_text):
        return 2.0
    return 1.0 if boxed in final_text else 0.0


def motif_outcome_reward(completions: list, answer: list | None = None, multi_round_final: list | None = None,
                         **kwargs: Any) -> list[float | None]:
    """Mean MOTIF score of each row's future final rounds (`multi_round_final`, from the multi_round rollout)
    against its `answer` column (text after "####" when present, as the official GSM8K loader extracts it);
    `None` (no score) for a row without an answer."""
    if not completions:
        return []
    if multi_round_final is None:
        raise ValueError("motif_outcome_reward needs the `multi_round_final` field of the multi_round rollout "
                         "(recipe `rollout: multi_round`, or rollout_func=make_multi_round_rollout(...)).")
    if answer is None:
        raise ValueError("motif_outcome_reward needs an `answer` dataset column (the final answer, boxed-compared).")
    rewards: list[float | None] = []
    for finals, ans in zip(multi_round_final, answer, strict=True):
        if ans is None or not finals:
            rewards.append(None)
            continue
        ans = str(ans).split("####")[-1].strip()  # a raw GSM8K answer: the number after "####" (official l.56-59)
        rewards.append(sum(motif_trajectory_score(f, ans) for f in finals) / len(finals))
    return rewards
