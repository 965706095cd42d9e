"""iGRPO (Iterative GRPO): drafts first, then GRPO on refinements conditioned on the best draft.

The generation change runs in the trainer (`best_draft.condition_on_best_draft`, called from
`GRPOTrainer._generate_and_score_completions` before TRL's generation): it samples and scores the drafts and
rewrites each row's prompt, so that TRL generates, scores and trains the stage-2 refinements from the rewritten
prompt. This module registers the variant, validates its flags, holds the pure parts (best-draft selection, the
stage-2 prompt) and is the stage's filter, which keeps every rollout.
"""

from __future__ import annotations

from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import get_variant, register
from .prompt_rewrite import append_to_prompt

VARIANT_ID = "igrpo"
#: What follows the original prompt in stage 2; `{draft}` is replaced by the best draft's text (our choice).
IGRPO_DRAFT_TEMPLATE = "\n\nA previous attempt:\n{draft}\n\nImprove on this attempt and give your final answer."
_DRAFT_FIELD = "{draft}"


def validate(config: Any) -> None:
    """Config-time refusals naming the flag and the fix."""
    k = config.igrpo_num_drafts
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"igrpo_num_drafts={k!r}: use an integer >= 1 (drafts sampled per prompt in stage 1), or "
                         "None for one draft per rollout of the group (num_generations).")
    template = config.igrpo_draft_template
    if not isinstance(template, str) or _DRAFT_FIELD not in template:
        raise ValueError(f"igrpo_draft_template={template!r} must contain '{{draft}}', where the best draft's text "
                         f"goes (default {IGRPO_DRAFT_TEMPLATE!r}).")
    if getattr(config, "use_vllm", False):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} samples its stage-1 drafts with transformers `generate` "
                         "through the trainer's own generator; it does not run with use_vllm=True yet. Set "
                         "use_vllm=False.")
    estimator = getattr(config, "advantage_estimator", "grpo")
    if estimator not in (None, "grpo"):
        keyed = {"prompt_keys", "prompt_kl"} & set(get_variant(estimator).requires)
        if keyed:
            raise ValueError(f"advantage_estimator={estimator!r} keeps per-prompt state keyed by the prompt's tokens "
                             f"({sorted(keyed)}), and rollout_filter={VARIANT_ID!r} puts a new draft into every "
                             "prompt, so no prompt would ever be seen twice. Use another advantage_estimator.")


def best_draft_indices(draft_rewards: torch.Tensor) -> torch.Tensor:
    """`(P, k)` draft rewards of `P` prompts → `(P,)` index of each prompt's highest-reward draft.

    Ties go to the lowest index (so equal drafts, e.g. all scored 0, give draft 0); a NaN (unscored) draft is never
    chosen while another is scored; a prompt whose drafts are all NaN gets -1 (no draft). ±inf is an error.
    """
    if draft_rewards.dim() != 2 or draft_rewards.size(1) < 1:
        raise ValueError(f"draft rewards must be (prompts, num_drafts >= 1), got {tuple(draft_rewards.shape)}.")
    if torch.isinf(draft_rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf draft rewards; reward functions must return finite values or NaN."
        )
    scored = ~torch.isnan(draft_rewards)
    filled = draft_rewards.masked_fill(~scored, float("-inf"))
    top = filled.max(dim=1, keepdim=True).values
    k = draft_rewards.size(1)
    position = torch.arange(k, device=draft_rewards.device).expand_as(filled)
    first = position.masked_fill(~(scored & (filled == top)), k).min(dim=1).values
    return torch.where(scored.any(dim=1), first, torch.full_like(first, -1))


def conditioned_prompt(prompt: Any, draft: str, template: str = IGRPO_DRAFT_TEMPLATE) -> Any:
    """The stage-2 prompt: `prompt` followed by `template` with `{draft}` replaced by `draft` (plain substitution,
    so braces in the draft or the template need no escaping).

    Text prompts: string concatenation. Conversational prompts: a copy whose last user message gets the text
    appended (a content-block list gets a text block); other messages are kept as they are."""
    suffix = template.replace(_DRAFT_FIELD, draft)
    return append_to_prompt(prompt, suffix, selector=f"rollout_filter={VARIANT_ID!r}", what="draft")


@register(
    VARIANT_ID,
    name="iGRPO (Iterative GRPO): GRPO on refinements conditioned on the best of k drafts",
    paper="iGRPO: Self-Feedback-Driven LLM Reasoning, arXiv:2602.09000",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "igrpo_num_drafts": None, "igrpo_draft_template": IGRPO_DRAFT_TEMPLATE},
    params=("igrpo_num_drafts", "igrpo_draft_template"),
    validate=validate,
)
def igrpo(batch: RolloutBatch) -> torch.Tensor:
    r"""iGRPO's two-stage rollout (arXiv:2602.09000, abstract; the catalog's `self_conditioning="best_draft"`,
    `num_drafts=k`, here `rollout_filter="igrpo"`, `igrpo_num_drafts=k`).

    For every prompt `x` of the training batch (one group of `G = num_generations` rows):

    - Stage 1 (no gradient): sample `k` drafts `d_1..d_k ~ π_θ(·|x)` with the run's own generator and sampling
      settings, score each with the run's reward functions and weights, `s_j = Σ_f w_f r_f(x, d_j)` ("the same
      scalar reward signal used for optimization"), and pick `j* = argmax_j s_j`.
    - Stage 2 (GRPO): the prompt becomes `x' = x ⊕ template(d_{j*})`; the `G` rollouts `y_i ~ π_θ(·|x')` are
      generated, scored (`r_i = Σ_f w_f r_f(x', y_i)`) and trained by TRL's GRPO (or whichever advantage, token and
      objective stages are set) with log-probs `log π_θ(y_i | x')`. Only the refinements `y_i` carry loss; drafts
      are never trained.

    Shapes: `k` drafts per prompt, `(P, k)` draft rewards over the `P` prompts of the global generation batch;
    the batch the later stages see is TRL's usual `(N = P·G)` rows, with `prompt_ids` the tokens of `x'`.

    Source: the paper's abstract (Stage 1 samples drafts and selects the highest-reward one with the reward used
    for optimisation; Stage 2 appends it to the original prompt and applies a GRPO-style update on draft-conditioned
    refinements). No official code is known; the choices below are ours:

    - Choice: `igrpo_num_drafts=None` draws `k = G` drafts per prompt (a stage-1 group as large as the trained one;
      every step then generates `2G` completions per prompt). The paper's value is not known to us.
    - Choice: `template` (`igrpo_draft_template`) is `"\n\nA previous attempt:\n{draft}\n\nImprove on this attempt
      and give your final answer."`, appended to the text of the last user message (conversational prompts) or to
      the prompt string. The draft is the decoded completion as the reward functions scored it (special tokens
      skipped), not stripped.
    - Choice: ties go to the lowest draft index, so when every draft scores the same (e.g. all 0) draft 1 is
      appended: the paper conditions on "the best draft" unconditionally, and a failed attempt still shows the
      problem worked once. NaN (unscored) drafts are never chosen over scored ones; when every draft of a prompt is
      NaN, stage 2 runs on the original prompt (plain GRPO for that group), counted in
      `groupx/igrpo_prompts_without_draft`.
    - Choice: the stage-2 reward functions receive the stage-2 prompt `x'` as `prompts` (what the refinement
      answers) plus the extra columns `igrpo_draft` (the appended text, or None) and `igrpo_prompt` (the original
      prompt); the completions table logs `x'`.
    - Choice: evaluation (model not training) samples plainly from `x`, as the paper evaluates single-shot.

    Several processes: the process holding a group's first row samples that group's `k` drafts (every process makes
    one generation call of the same size, padded with repeats of its first row, as `baseline_rollouts.py` does),
    the draft rewards and texts are gathered, and every process picks the same draft for the same group, so a group
    split across processes gets one stage-2 prompt.

    Scope: transformers generation (TRL's `_generate_single_turn`, so DeepSpeed/FSDP handling and
    `generation_micro_group_size` apply; `use_transformers_continuous_batching` goes through the same call but is not
    exercised by the tests); `use_vllm=True` is refused at config time. Text prompts only (drafts of multimodal
    prompts are refused), single-turn only (a rollout_func, tools or environments are refused at trainer
    construction). Advantage variants with per-prompt state keyed by the prompt tokens (`prompt_keys`,
    `prompt_kl`) are refused at config time. Stage-1 drafts use the run's base `temperature` even with
    `generation_temperatures` (which applies to the stage-2 rollouts).

    This function is the stage's filter on the stage-2 batch: it keeps every rollout, so the variant composes with
    every advantage estimator (except the per-prompt-state ones above), token weighting and objective, but not
    with another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global stage-2 batch.

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
