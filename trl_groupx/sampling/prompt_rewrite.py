"""Sampling variants that rewrite the training rows' prompts before TRL generates from them: the shared text helper.

`GRPOTrainer._generate_and_score_completions` calls the active sampling variant's `before` hook on the batch's rows
(training only; `generation_hooks.py`); TRL then generates, scores and trains every rollout under the rewritten
prompt. iGRPO appends each
group's best draft (`best_draft.py`), RC-GRPO a reward-goal token per rollout (`reward_tokens.py`),
consistency_grpo one of the row's paraphrases per rollout (`paraphrase_groups.py`), SAGE-light a hint at each
prompt's tracked level (`self_hints.py`).
"""

from __future__ import annotations

import copy
from typing import Any


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
