"""GCPO reference injection: the generation-output rewrite behind `rollout_filter="gcpo_ref"` (see `gcpo_ref.py`).

Pure parts (`all_fail_groups`, `injection_rows`, `reference_completion_ids`, `replace_completions`) are unit-tested
on synthetic outputs; `inject_reference_solutions` is the trainer glue that re-scores the injected rows and
recomputes their per-token log-probs.
"""

from __future__ import annotations

from typing import Any

import torch
from trl.trainer.utils import use_adapter

from ._scoring import score_aside
from .dapo_dynamic_sampling import LEFT_PADDED, RIGHT_PADDED, pad_to_width, weighted_rewards
from .gcpo_ref import VARIANT_ID

# Output keys the rewrite recomputes for the injected rows; any other per-row key is refused (multimodal inputs).
_LOGP_KEYS = ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps")
_KNOWN_KEYS = set(LEFT_PADDED) | set(RIGHT_PADDED) | {"advantages", "num_items_in_batch"}


def all_fail_groups(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """`(N/G,)` bool: groups with at least one scored rollout and every scored reward `< threshold` (NaN = unscored)."""
    if torch.isinf(rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    grouped = rewards.view(-1, group_size)
    scored = ~torch.isnan(grouped)
    solved = scored & (grouped >= threshold)
    return scored.any(dim=1) & ~solved.any(dim=1)


def injection_rows(all_fail: torch.Tensor, group_size: int) -> torch.Tensor:
    """Global row index of the slot replaced in each all-fail group: the group's last rollout."""
    return torch.nonzero(all_fail, as_tuple=False).flatten() * group_size + (group_size - 1)


def reference_completion_ids(text: str, tokenizer: Any, eos_token_id: int, max_length: int) -> list[int]:
    """Token ids of a reference solution as a completion: `tokenize(text) + [EOS]`, cut to `max_length` tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (list(ids) + [eos_token_id])[:max_length]


def replace_completions(
    output: dict[str, Any],
    rows: list[int],
    completions: list[list[int]],
    pad_token_id: int,
    sequence_level_is: bool = False,
    selector: str = f"rollout_filter={VARIANT_ID!r}",
) -> dict[str, Any]:
    """`output` with the completions of local `rows` replaced by `completions`; returns a new dict.

    Completion-side tensors are re-padded on the right to the widest completion (padding values of
    `dapo_dynamic_sampling.RIGHT_PADDED`); the replaced rows get completion mask 1 on their tokens, tool mask 1,
    vLLM importance ratio 1, and zero log-probs (placeholders, to be recomputed by the caller). Prompt-side
    tensors are unchanged (the prompt of a row stays its own). `advantages` and `num_items_in_batch` are left to
    the caller (the advantage stage recomputes the former; the latter depends on the gathered masks).
    `sequence_level_is`: `importance_sampling_ratio` is `(B, 1)` (TRL's `sequence_*` modes), not widened.
    `selector`: the flag named in errors (GCPO or EDGE-GRPO's GEC)."""
    unknown = set(output) - _KNOWN_KEYS
    if unknown:
        raise NotImplementedError(
            f"{selector} cannot rewrite the generation outputs {sorted(unknown)} (multimodal "
            "inputs are not supported)."
        )
    out = dict(output)
    if not rows:
        return out
    width = max([output["completion_ids"].size(1)] + [len(c) for c in completions])
    for key, value in RIGHT_PADDED.items():
        if key not in out or (key == "importance_sampling_ratio" and sequence_level_is):
            continue
        out[key] = pad_to_width(out[key], width, "right", pad_token_id if value is None else value).clone()
    for row, ids in zip(rows, completions, strict=True):
        n = len(ids)
        out["completion_ids"][row] = pad_token_id
        out["completion_ids"][row, :n] = torch.tensor(ids, dtype=out["completion_ids"].dtype)
        out["completion_mask"][row] = 0
        out["completion_mask"][row, :n] = 1
        if "tool_mask" in out:
            out["tool_mask"][row] = 1
        for key in _LOGP_KEYS:
            if key in out:
                out[key][row] = 0.0
        if "importance_sampling_ratio" in out:
            if sequence_level_is:
                out["importance_sampling_ratio"] = out["importance_sampling_ratio"].clone()
            out["importance_sampling_ratio"][row] = 1.0
    return out


# ---- trainer glue (called by GRPOTrainer._generate_and_score_completions) ----------------------------------------


def check_reference_injection(trainer: Any) -> None:
    """Construction-time refusals: what the rewrite cannot do, named with the fix."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "tools", None) or getattr(
        trainer, "environment_factories", None
    ):
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} replaces a rollout by a single-turn reference completion, which a "
            "rollout_func, tools or an environment_factory would not have produced; train without them or unset "
            "rollout_filter."
        )
    column = trainer.args.gcpo_ref_column
    columns = getattr(trainer.train_dataset, "column_names", None)
    if columns is not None and column not in columns:
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} reads each prompt's reference solution from the dataset column "
            f"gcpo_ref_column={column!r}, which train_dataset lacks (columns: {list(columns)}); add the column or "
            "set gcpo_ref_column to the one that holds the solutions."
        )


def _reference_text(row: dict[str, Any], column: str) -> str:
    """The reference solution of a dataset row; a clear error where the row has none (the paper assumes every
    prompt has one)."""
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r}: a prompt whose rollouts all failed has no reference solution in "
            f"gcpo_ref_column={column!r} (value {value!r}); fill the column for every row or filter such rows out."
        )
    return str(value)


def _rescore(trainer: Any, inputs: list[dict[str, Any]], rows: list[int], completion_ids: list[list[int]],
             count: int) -> torch.Tensor:
    """Rewards `(P × count, K)` of the injected rows, gathered: every process scores exactly `count` rows (its own
    injected rows, then repeats of its first row as filler), because TRL's `_calculate_rewards` gathers."""
    fill_rows = rows + [rows[0] if rows else 0] * (count - len(rows))
    filler = completion_ids[0] if completion_ids else [trainer._tokenizer.eos_token_id]
    fill_ids = completion_ids + [filler] * (count - len(rows))
    return score_aside(trainer, [inputs[r] for r in fill_rows], fill_ids)


def _recompute_logps(trainer: Any, output: dict[str, Any], rows: list[int]) -> None:
    """Current-model (old, sampling) and reference-model log-probs of the injected local rows, in place."""
    needed = [k for k in _LOGP_KEYS if k in output]
    if not rows or not needed:
        return
    index = torch.tensor(rows, device=output["completion_ids"].device)
    sub = {k: output[k].index_select(0, index) for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                          "completion_mask")}
    mask = sub["completion_mask"]
    if "old_per_token_logps" in output or "sampling_per_token_logps" in output:
        current, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
        for key in ("old_per_token_logps", "sampling_per_token_logps"):
            if key in output:  # on-policy by choice: behaviour = current model, so every ratio starts at 1
                output[key][index] = (current * mask).to(output[key].dtype)
    if "ref_per_token_logps" in output:
        if trainer.ref_model is not None:
            ref, _ = trainer._rollout_logps(sub, trainer.ref_model, compute_entropy=False)
        else:  # LoRA: the base model (or the "ref" adapter), as TRL computes it
            model = trainer.accelerator.unwrap_model(trainer.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                ref, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
        output["ref_per_token_logps"][index] = (ref * mask).to(output["ref_per_token_logps"].dtype)


def raise_together(error: ValueError | None, accelerator: Any, column: str,
                   selector: str = f"rollout_filter={VARIANT_ID!r}") -> None:
    """Raise on every process when any process lacks a reference: the others would otherwise wait forever in the
    re-scoring gather. The process that found the empty row raises its own message."""
    failed = error is not None
    if accelerator.num_processes > 1:
        failed = bool(accelerator.gather(torch.tensor([failed], device=accelerator.device)).any().item())
    if error is not None:
        raise error
    if failed:
        if selector != f"rollout_filter={VARIANT_ID!r}":
            raise ValueError(f"{selector}: another process found a row that needs a reference and has none in column "
                             f"{column!r}; fill the column for every row or filter such rows out.")
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r}: another process found a prompt whose rollouts all failed and that has no "
            f"reference solution in gcpo_ref_column={column!r}; fill the column for every row or filter such rows out."
        )


def inject_reference_solutions(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """GCPO injection on one generation batch: returns the rewritten local `output` and updates
    `trainer._rewards_per_func` (global `(N, K)`, identical on every process) with the injected rows' rewards.

    Every process computes the same all-fail groups from the gathered rewards, rewrites the injected rows it owns
    (a group may span processes: its last row belongs to one of them) and joins the same re-scoring call."""
    args, accel = trainer.args, trainer.accelerator
    group_size, procs, rank = trainer.num_generations, accel.num_processes, accel.process_index
    local_n = output["completion_ids"].size(0)
    rewards_per_func = trainer._rewards_per_func
    rewards = weighted_rewards(rewards_per_func, trainer.reward_weights)
    threshold = args.gcpo_ref_success_threshold
    global_rows = injection_rows(all_fail_groups(rewards, group_size, threshold), group_size).tolist()
    counts = [sum(1 for r in global_rows if r // local_n == p) for p in range(procs)]
    mine = [r - rank * local_n for r in global_rows if r // local_n == rank]
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    metrics["groupx/reference_injected_groups"].append(float(len(global_rows)))
    if not global_rows:
        metrics["groupx/reference_failed"].append(0.0)
        return output

    tokenizer = trainer._tokenizer
    texts, missing = [], None
    try:
        texts = [args.gcpo_ref_template.replace("{ref}", _reference_text(inputs[r], args.gcpo_ref_column))
                 for r in mine]
    except ValueError as err:
        missing = err
    raise_together(missing, accel, args.gcpo_ref_column)
    ids = [reference_completion_ids(t, tokenizer, tokenizer.eos_token_id, trainer.max_completion_length) for t in texts]
    sequence_is = bool(getattr(trainer, "use_vllm", False) and trainer.vllm_importance_sampling_correction
                       and trainer.vllm_importance_sampling_mode.startswith("sequence"))
    output = replace_completions(output, mine, ids, trainer._tokenizer.pad_token_id, sequence_is)
    if trainer.mask_truncated_completions:  # TRL's rule: a completion without EOS at its end is masked
        ends = [*trainer.eos_token_ids, trainer._tokenizer.pad_token_id]
        for row, seq in zip(mine, ids):
            if seq[-1] not in ends:
                output["completion_mask"][row] = 0
                if "tool_mask" in output:
                    output["tool_mask"][row] = 0
    _recompute_logps(trainer, output, mine)
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    output["num_items_in_batch"] = accel.gather(loss_mask.sum()).sum()

    count = max(counts)
    scored = _rescore(trainer, inputs, mine, ids, count)  # (P × count, K), process order
    new_rows = torch.tensor(
        [p * count + j for p in range(procs) for j in range(counts[p])], device=scored.device, dtype=torch.long
    )
    rewards_per_func = rewards_per_func.clone()
    targets = torch.tensor(global_rows, device=rewards_per_func.device, dtype=torch.long)
    rewards_per_func[targets] = scored.index_select(0, new_rows).to(rewards_per_func)
    trainer._rewards_per_func = rewards_per_func
    ref_rewards = weighted_rewards(rewards_per_func[targets], trainer.reward_weights)
    metrics["groupx/reference_failed"].append(float((~(ref_rewards >= threshold)).sum().item()))
    return output
