"""GCPO (Group Contrastive Policy Optimization): a reference solution joins every group the model failed entirely.

The rewrite of the generation output runs in the trainer (`reference_injection.inject_reference_solutions`, called
from `GRPOTrainer._generate_and_score_completions` after TRL's generation and scoring, before the other stages);
this module registers the variant, validates its flags and is the stage's filter, which keeps every rollout.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register

VARIANT_ID = "gcpo_ref"


def validate(config: Any) -> None:
    column = config.gcpo_ref_column
    if not isinstance(column, str) or not column:
        raise ValueError(
            f"gcpo_ref_column={column!r}: name the dataset column that holds each prompt's reference solution "
            "(e.g. gcpo_ref_column='solution')."
        )
    template = config.gcpo_ref_template
    if not isinstance(template, str) or "{ref}" not in template:
        raise ValueError(
            f"gcpo_ref_template={template!r} must contain '{{ref}}', where the reference solution goes "
            "(default '{ref}': the column's text as it is)."
        )
    threshold = config.gcpo_ref_success_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(
            f"gcpo_ref_success_threshold={threshold!r}: use a finite number; a rollout whose reward is at least this "
            "value counts as solved (1.0 for 0/1 accuracy rewards)."
        )


@register(
    VARIANT_ID,
    name="GCPO (Group Contrastive Policy Optimization): reference solution in all-fail groups",
    paper="GCPO: When Contrast Fails, Go Gold, arXiv:2510.07790",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "gcpo_ref_column": "solution", "gcpo_ref_success_threshold": 1.0,
           "gcpo_ref_template": "{ref}", "importance_sampling_level": "sequence", "beta": 0.0},
    params=("gcpo_ref_column", "gcpo_ref_success_threshold", "gcpo_ref_template"),
    needs=("reference solution column",),
    validate=validate,
)
def gcpo_ref(batch: RolloutBatch) -> torch.Tensor:
    r"""GCPO's Golden-Answer injection (arXiv:2510.07790; the catalog's `all_fail_injection="reference"`).

    When every scored rollout of a group fails, one rollout of the group is replaced by the prompt's reference
    solution (the "Golden Answer"), so that the group has a correct response and a non-zero advantage toward it:

    - all-fail group `g`: at least one scored rollout and `r_j < τ` for every scored `j ∈ g`
      (`τ = gcpo_ref_success_threshold`, `r` = the trainer's weighted reward sum, NaN = unscored, ignored);
    - in each such group the LAST rollout (`j = G - 1` within the group) becomes the reference completion
      `tokenize(template(solution)) + EOS`, truncated to `max_completion_length` (`gcpo_ref_template`, default
      the column's text as it is);
    - that row is scored again by the run's reward functions (`r_ref` is what they say, not assumed 1), and the
      advantage stage runs on the updated rewards: for GRPO with 0/1 rewards and `G` rollouts,
      `A_ref = (1 - 1/G) / (std + 1e-4) > 0` and the failed rollouts get `-(1/G) / (std + 1e-4)`.

    Mixed groups, all-solved groups and all-unscored groups are untouched. Evaluation never injects.

    The paper pairs the injection with sequence-level importance sampling (GSPO's length-normalised sequence
    ratio) and no KL penalty; those are TRL's `importance_sampling_level="sequence"` and `beta=0`, set by the
    variant's flags and the recipe, so they are not reimplemented here.

    Sources: the paper's abstract and public summaries of arXiv:2510.07790 (Golden Answer replaces a rollout when
    all rollouts fail; sequence-level IS; KL removed). The official code (github.com/AchoWu/GCPO) is not
    available here (no snapshot, not indexed), so the choices below are ours:

    - Choice: the failure test uses the weighted reward sum against a threshold (default 1.0 = a 0/1 accuracy
      reward's "correct"); a group whose rollouts all fail with different partial rewards (e.g. format rewards)
      is injected too, since the paper's condition is "cannot solve", not zero variance.
    - Choice: the replaced slot is the group's last rollout (the rollouts of a group are exchangeable).
    - Choice: the injected row is treated as on-policy. The reference was not sampled from the policy, so its
      behaviour log-probs are unknown; its `old_per_token_logps` (when TRL keeps them) are the current model's,
      detached, giving ratio 1 at the first update (and the sequence ratio on later iterations measures only the
      drift since generation, as for sampled rows); `sampling_per_token_logps` equal those and the vLLM
      `importance_sampling_ratio` of the row is 1. Its `ref_per_token_logps` are recomputed under the reference
      model.
    - Choice: a reference truncated at `max_completion_length` has no EOS; with `mask_truncated_completions` it
      is masked like any truncated completion.
    - A reference that its reward functions score as a failure is kept (its reward is what they return) and
      counted in `groupx/reference_failed`; `groupx/reference_injected_groups` counts injected groups.

    Scope: single-turn generation only (a rollout_func, tools or an environment_factory is refused at trainer
    construction, as is a dataset without the `gcpo_ref_column` column; a row with an empty reference raises when
    its group needs it); multimodal outputs are refused. With vLLM's importance-sampling correction the injected
    row's correction ratio is 1 (token and sequence modes). TRL's logged `reward` metrics and completions table
    show the batch as generated, before the injection. A group that spans processes is handled: every process
    finds the same groups from the gathered rewards, the owner of the group's last row rewrites it, and all
    processes join one re-scoring call of equal size.

    This function is the stage's filter on the rewritten batch: it keeps every rollout, so the stage composes with
    every advantage estimator, token weighting and objective, but not with another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch after injection (the flags are read by the injection).

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
