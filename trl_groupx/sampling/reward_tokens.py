"""RC-GRPO's trainer glue behind `rollout_filter="rc_grpo"` (see `rc_grpo.py` for the method and choices).

`check_reward_tokens` refuses, at trainer construction, a tokenizer or model that does not know the condition
tokens; `condition_on_reward_tokens` returns a training batch's rows with each prompt carrying its row's token;
`mask_condition_tokens` keeps condition tokens that a completion samples itself out of the loss.
"""

from __future__ import annotations

from typing import Any

import torch

from .rc_grpo import CONDITION_COLUMN, MIX_FLAG, TOKENS_FLAG, VARIANT_ID, condition_prompt, row_conditions


def condition_token_ids(tokenizer: Any, tokens: list[str]) -> list[int]:
    """The id of each condition token; `ValueError` naming the flag and the fix when one is not a single token."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer
    ids = []
    for token in tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1 or encoded[0] == tokenizer.unk_token_id:
            raise ValueError(
                f"rollout_filter={VARIANT_ID!r}: {TOKENS_FLAG} entry {token!r} is {len(encoded)} token(s) for this "
                "tokenizer, not one known token: RC-GRPO needs the reward-conditioned (RCTP) policy, fine-tuned with "
                "these tokens in its prompts. Add them with trl_groupx.sampling.rctp.add_condition_tokens(tokenizer, "
                "model), fine-tune on trl_groupx.sampling.rctp.reward_conditioned_sft_rows(...) first, and train "
                f"from that checkpoint (or set {TOKENS_FLAG} to the tokens it was fine-tuned with)."
            )
        ids.append(encoded[0])
    return ids


def check_reward_tokens(trainer: Any) -> None:
    """Trainer-construction refusals: each condition token is one token of the tokenizer with an embedding row."""
    ids = condition_token_ids(trainer.processing_class, list(getattr(trainer.args, TOKENS_FLAG)))
    rows = trainer.accelerator.unwrap_model(trainer.model).get_input_embeddings().num_embeddings
    missing = [t for t, i in zip(getattr(trainer.args, TOKENS_FLAG), ids, strict=True) if i >= rows]
    if missing:
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r}: {TOKENS_FLAG} {missing} have ids beyond the model's {rows} embedding "
            "rows: the tokenizer knows them but this model was not resized for them. Load the RCTP checkpoint that "
            "was fine-tuned with them (trl_groupx.sampling.rctp.add_condition_tokens resizes the embeddings)."
        )


def condition_on_reward_tokens(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This process's training rows with each prompt carrying its condition token, in the configured ratio per group
    (`rc_grpo.row_conditions`, seeded by the run's seed and the step, so no communication is needed). Every process
    draws the whole generation batch's assignment and keeps its own rows."""
    args = trainer.args
    tokens = list(getattr(args, TOKENS_FLAG))
    if any("prompt" not in row for row in inputs):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} puts a reward token into each row's prompt: every row needs a "
                         "`prompt` (an environment that supplies the prompt from reset() cannot be conditioned).")
    micro_step = getattr(trainer, "_step", 0) % max(1, args.gradient_accumulation_steps)
    local_n, rank = len(inputs), trainer.accelerator.process_index
    # the whole generation batch's assignment: every process can draw it, so the logged shares need no gather
    every_row = row_conditions(list(getattr(args, MIX_FLAG)), trainer.num_generations, 0,
                               local_n * trainer.accelerator.num_processes, seed=args.seed,
                               step=trainer.state.global_step, micro_step=micro_step)
    conditions = every_row[rank * local_n:(rank + 1) * local_n]
    conditioned = [{**row, "prompt": condition_prompt(row["prompt"], tokens[k]), CONDITION_COLUMN: tokens[k]}
                   for row, k in zip(inputs, conditions, strict=True)]
    metrics = trainer._metrics["train"]
    for j in range(len(tokens)):
        metrics[f"groupx/rc_grpo_share_{j}"].append(every_row.count(j) / len(every_row))
    return conditioned


def mask_condition_tokens(trainer: Any, output: dict[str, Any]) -> None:
    """Leave the condition tokens a completion samples itself out of the loss, in place: 0 in `output["tool_mask"]`
    (created as ones when the batch has none), so they stay attended (the later tokens' log-probs are those they
    were sampled with) but carry no loss, as TRL does for tool output. `num_items_in_batch` is recounted over the
    loss mask. Runs after the advantage stages, whose multi-turn step credit reads turns from `tool_mask`."""
    ids = torch.tensor(condition_token_ids(trainer.processing_class, list(getattr(trainer.args, TOKENS_FLAG))),
                       device=output["completion_ids"].device)
    completion_mask = output["completion_mask"]
    sampled = torch.isin(output["completion_ids"], ids) & completion_mask.bool()
    tool_mask = output.get("tool_mask", torch.ones_like(completion_mask))
    output["tool_mask"] = tool_mask * (~sampled).to(tool_mask.dtype)
    acc = trainer.accelerator
    output["num_items_in_batch"] = acc.gather((completion_mask * output["tool_mask"]).sum()).sum()
    counts = acc.gather(torch.stack([sampled.sum(), completion_mask.sum()]).float().view(1, 2)).sum(0)
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode]["groupx/rc_grpo_sampled_condition_token_fraction"].append(
        (counts[0] / counts[1].clamp(min=1)).item())
