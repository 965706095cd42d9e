"""Reward functions for ``GRPOTrainer`` (TRL 1.16 signature: ``f(prompts, completions, completion_ids, **kwargs)``
with the dataset columns, ``trainer_state``, ``log_extra`` and ``log_metric`` in ``kwargs``; returns one
``float | None`` per completion, ``None`` = no score, which TRL turns into NaN and leaves out of the statistics).

Every function accepts plain-text and conversational completions. General rewards wrap TRL's own
``trl.rewards`` (math-verify accuracy, think format, DAPO soft overlong punishment); the application papers of the
catalog (plain GRPO, the contribution is the reward) each have a module named by their catalog id.

By name, as the recipe runner (``trl-groupx grpo``, ``reward_funcs: [...]``) resolves them: :data:`REWARD_FUNCS`.
Rewards with a ``bind(args)`` method take settings from the training arguments (e.g. ``max_completion_length``)
when the runner builds the trainer (:func:`bind_training_args`); in Python, construct the classes directly with
the parameters you want.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .arithmetic_prm import arithmetic_prefix_prm
from .confidence import confidence_brier_reward, parse_confidence
from .consistency_grpo import StabilityReward, stability_reward
from .ctde_marl import JointTeamReward, joint_team_reward
from .curriculum_length import CurriculumLengthReward, budget_schedule, curriculum_length_reward
from .dagger import ExecutableGraphReward, GraphError, executable_graph_reward, execute_graph
from .format import TagFormatReward, think_answer_format_reward, think_format_reward
from .grpo_asr import WERReward, wer, wer_reward
from .math import answer_accuracy_reward, math_accuracy_reward, math_equal
from .motif import motif_outcome_reward
from .overlong import DAPOOverlongReward, dapo_overlong_reward
from .purge import ForbiddenConceptReward, forbidden_concept_reward
from .timemaster import StructuredSectionsReward, structured_sections_reward
from .tlpo import language_consistency_reward
from .ton import drop_thought, thought_dropout, ton_format_reward
from .tw_grpo import multi_choice_partial_reward
from .visual_rft import IoUReward, iou_reward, label_match_reward

#: Application-paper id (catalog) → the registered reward names that implement it.
APPLICATION_REWARDS: dict[str, tuple[str, ...]] = {
    "curriculum_length": ("curriculum_length_reward",),
    "grpo_asr": ("wer_reward",),
    "purge": ("forbidden_concept_reward",),
    "visual_rft": ("iou_reward", "label_match_reward"),
    "tw_grpo": ("multi_choice_partial_reward",),
    "dagger": ("executable_graph_reward",),
    "consistency_grpo": ("stability_reward",),
    "tlpo": ("language_consistency_reward",),
    "timemaster": ("structured_sections_reward",),
    "ctde_marl": ("joint_team_reward",),
    "ton": ("ton_format_reward",),
    "motif": ("motif_outcome_reward",),  # with the multi_round rollout (trl_groupx/rollouts)
}

#: Registered reward name → reward function (instances carry the papers' default parameters).
REWARD_FUNCS: dict[str, Callable[..., list[float | None]]] = {
    "math_accuracy_reward": math_accuracy_reward,
    "answer_accuracy_reward": answer_accuracy_reward,
    "think_answer_format_reward": think_answer_format_reward,
    "dapo_overlong_reward": dapo_overlong_reward,
    "curriculum_length_reward": curriculum_length_reward,
    "wer_reward": wer_reward,
    "forbidden_concept_reward": forbidden_concept_reward,
    "iou_reward": iou_reward,
    "label_match_reward": label_match_reward,
    "multi_choice_partial_reward": multi_choice_partial_reward,
    "executable_graph_reward": executable_graph_reward,
    "stability_reward": stability_reward,
    "language_consistency_reward": language_consistency_reward,
    "structured_sections_reward": structured_sections_reward,
    "joint_team_reward": joint_team_reward,
    "ton_format_reward": ton_format_reward,
    "arithmetic_prefix_prm": arithmetic_prefix_prm,
    "confidence_brier_reward": confidence_brier_reward,
    "motif_outcome_reward": motif_outcome_reward,
}


def bind_training_args(funcs: list[Callable[..., Any]], args: Any) -> list[Callable[..., Any]]:
    """``funcs`` with every reward that has a ``bind(args)`` method replaced by its bound copy (the shared
    registered instances are never mutated)."""
    return [f.bind(args) if callable(getattr(f, "bind", None)) else f for f in funcs]


__all__ = [
    "APPLICATION_REWARDS",
    "REWARD_FUNCS",
    "CurriculumLengthReward",
    "DAPOOverlongReward",
    "ExecutableGraphReward",
    "ForbiddenConceptReward",
    "GraphError",
    "IoUReward",
    "JointTeamReward",
    "StabilityReward",
    "StructuredSectionsReward",
    "TagFormatReward",
    "WERReward",
    "answer_accuracy_reward",
    "arithmetic_prefix_prm",
    "bind_training_args",
    "budget_schedule",
    "confidence_brier_reward",
    "curriculum_length_reward",
    "dapo_overlong_reward",
    "drop_thought",
    "executable_graph_reward",
    "execute_graph",
    "forbidden_concept_reward",
    "iou_reward",
    "joint_team_reward",
    "label_match_reward",
    "language_consistency_reward",
    "math_accuracy_reward",
    "math_equal",
    "motif_outcome_reward",
    "multi_choice_partial_reward",
    "parse_confidence",
    "stability_reward",
    "structured_sections_reward",
    "think_answer_format_reward",
    "think_format_reward",
    "thought_dropout",
    "ton_format_reward",
    "wer",
    "wer_reward",
]
