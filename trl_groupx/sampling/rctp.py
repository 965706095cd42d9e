"""RC-GRPO stage 1, the Reward-Conditioned Trajectory Policy (RCTP): the tokens and the SFT data.

RC-GRPO (`rollout_filter="rc_grpo"`, `rc_grpo.py`) samples rollouts conditioned on reward-goal tokens, so the
policy it starts from must already have learned what the tokens mean. The two-stage workflow:

1. Tokens. `add_condition_tokens(tokenizer, model)` adds `<|high_reward|>` and `<|low_reward|>` (or your tokens) as
   special tokens, so each is one id, and resizes the model's embeddings to the tokenizer.
2. Data. Score mixed-quality trajectories of your task (e.g. the SFT model's own multi-turn rollouts in the tool
   environment, kept with their outcome reward) and turn them into prompt-completion SFT rows with
   `reward_conditioned_sft_rows(trajectories, threshold=...)`: a trajectory whose reward reaches the threshold gets
   `<|high_reward|>` in its prompt, the others `<|low_reward|>`, placed exactly where RC-GRPO puts it
   (`rc_grpo.condition_prompt`: end of the prompt string / of the last user message).
3. SFT. Fine-tune with TRL's `SFTTrainer` on those rows (prompt-completion format: the loss is on the completion
   only, so the tokens are only ever conditioned on). With LoRA, also train and save the embedding rows of the new
   tokens (e.g. `modules_to_save=["embed_tokens", "lm_head"]`), or they stay at their initial values. Save the
   model and the tokenizer: that folder is the RCTP checkpoint.
4. RL. `trl-groupx grpo --config recipes/rc_grpo.yaml` with `model_name_or_path` = that folder. The trainer refuses
   a tokenizer in which a condition token is not one token.

Example::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_groupx.sampling.rctp import add_condition_tokens, reward_conditioned_sft_rows

    tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-7B-Instruct")
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct")
    add_condition_tokens(tokenizer, model)
    rows = reward_conditioned_sft_rows(scored_trajectories, threshold=1.0)  # [{"prompt", "completion", ...}]
    # SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(rows), ...).train()
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .rc_grpo import DEFAULT_CONDITION_TOKENS, TOKENS_FLAG, condition_prompt


def add_condition_tokens(tokenizer: Any, model: Any = None,
                         tokens: Sequence[str] = DEFAULT_CONDITION_TOKENS) -> list[int]:
    """Add `tokens` to `tokenizer` as special tokens (each then encodes to one id, whatever the text around it;
    tokens already present are kept) and, when `model` is given, resize its input (and tied output) embeddings to
    the tokenizer's length if they are smaller. Returns the tokens' ids, in order."""
    text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer
    text_tokenizer.add_tokens(list(tokens), special_tokens=True)
    ids = [text_tokenizer.convert_tokens_to_ids(t) for t in tokens]
    for token, i in zip(tokens, ids, strict=True):
        if text_tokenizer.encode(token, add_special_tokens=False) != [i]:
            raise ValueError(f"{token!r} does not encode to the single id {i} after adding it; pick another string.")
    if model is not None and model.get_input_embeddings().num_embeddings < len(text_tokenizer):
        model.resize_token_embeddings(len(text_tokenizer))
    return ids


def reward_conditioned_sft_rows(
    trajectories: Iterable[Mapping[str, Any]], *, threshold: float,
    tokens: Sequence[str] = DEFAULT_CONDITION_TOKENS, reward_key: str = "reward",
) -> list[dict[str, Any]]:
    """RCTP's SFT rows from scored trajectories.

    Each trajectory is a mapping with `prompt` (a string or a list of chat messages), `completion` (a string or a
    list of messages: the whole multi-turn trajectory, tool calls and tool results included) and `reward`
    (`reward_key`). Its row is a copy without the reward whose prompt carries `tokens[0]` (`<|high_reward|>`) when
    `reward >= threshold`, else `tokens[1]` (`<|low_reward|>`), placed by `rc_grpo.condition_prompt`; other keys
    (e.g. `tools`) are kept. A missing, NaN or infinite reward is an error naming the trajectory: score it or drop it
    (silently dropping would change the high/low mix the policy learns from)."""
    if len(tokens) != 2:
        raise ValueError(f"tokens={list(tokens)!r}: RCTP labels a trajectory high or low, so give exactly two tokens "
                         "(high first), as in the RL stage's rc_grpo_prompt_condition_tokens.")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"threshold={threshold!r} must be a finite number (reward at or above it -> {tokens[0]}).")
    rows = []
    for i, trajectory in enumerate(trajectories):
        missing = {"prompt", "completion", reward_key} - set(trajectory)
        if missing:
            raise ValueError(f"trajectory {i} lacks {sorted(missing)}; each needs prompt, completion and {reward_key}.")
        reward = trajectory[reward_key]
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"trajectory {i} has {reward_key}={reward!r}; RCTP needs a finite reward for every "
                             "trajectory: score it or drop it before building the rows.")
        token = tokens[0] if reward >= threshold else tokens[1]
        row = {k: v for k, v in trajectory.items() if k != reward_key}
        row["prompt"] = condition_prompt(trajectory["prompt"], token)
        rows.append(row)
    return rows


def save_with_condition_tokens(model_path: str, tokenizer: Any, out_dir: str | Path,
                               tokens: Sequence[str] = DEFAULT_CONDITION_TOKENS) -> str:
    """A copy of the model at `model_path` and of `tokenizer` with `tokens` added (`add_condition_tokens`), saved to
    `out_dir`; returns that folder. Not an RCTP checkpoint (nothing is fine-tuned): `trl-groupx grpo --toy` uses it
    so that an RC-GRPO recipe runs on the shipped tiny model, whose tokenizer lacks the tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True)
    add_condition_tokens(tokenizer, model, tokens)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


__all__ = ["TOKENS_FLAG", "add_condition_tokens", "reward_conditioned_sft_rows", "save_with_condition_tokens"]
