"""Sampling variants that rewrite the training rows' prompts before TRL generates from them.

`GRPOTrainer._generate_and_score_completions` calls the active sampling variant's rewriter on the batch's rows
(training only); TRL then generates, scores and trains every rollout under the rewritten prompt. iGRPO appends each
group's best draft (`best_draft.py`), RC-GRPO a reward-goal token per rollout (`reward_tokens.py`),
consistency_grpo one of the row's paraphrases per rollout (`paraphrase_groups.py`), SAGE-light a hint at each
prompt's tracked level (`self_hints.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

Rewriter = Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]]]


def prompt_rewriter(variant: Any) -> Rewriter | None:
    """`rewrite(trainer, rows) -> rows` of the sampling variant `variant` (a registry record or None), or None when
    it does not rewrite prompts. Imported lazily: the rewriters depend on the trainer's generation helpers."""
    variant_id = getattr(variant, "id", None)
    if variant_id == "igrpo":
        from .best_draft import condition_on_best_draft

        return condition_on_best_draft
    if variant_id == "rc_grpo":
        from .reward_tokens import condition_on_reward_tokens

        return condition_on_reward_tokens
    if variant_id == "sage":  # SAGE-light hints before generation; plain SAGE re-rolls after (identity here)
        from .self_hints import hint_by_level

        return hint_by_level
    if variant_id == "consistency_grpo":
        from .paraphrase_groups import assign_paraphrase_prompts

        return assign_paraphrase_prompts
    return None


def append_to_prompt(prompt: Any, text: str, *, selector: str, what: str) -> Any:
    """`prompt` followed by `text`: appended to a text prompt, or to a copy of the last user message of a
    conversation (a content-block list gets a text block); the other messages are kept as they are. `selector` and
    `what` name the variant and what it appends in the error for a conversation without a user message."""
    if isinstance(prompt, str):
        return prompt + text
    messages = copy.deepcopy(prompt)
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ValueError(f"{selector}: a conversational prompt needs a user message to carry the {what}.")
    last = messages[users[-1]]
    if isinstance(last["content"], str):
        last["content"] = last["content"] + text
    else:
        last["content"] = [*last["content"], {"type": "text", "text": text}]
    return messages
