"""Paraphrase groups: the trainer glue behind `rollout_filter="consistency_grpo"` (see `consistency_grpo.py` for
the method and choices).

`check_paraphrase_column` refuses, at trainer construction, a training dataset without the variants column (and,
for an Arrow dataset, a row with no variants or more than `num_generations`); `assign_paraphrase_prompts` returns
a training batch's rows with rollout `j` of each group prompted by its row's `j mod V`-th variant.
"""

from __future__ import annotations

from typing import Any

from .consistency_grpo import COLUMN_FLAG, VARIANT_ID, assign_paraphrases, check_row_variants, variant_index


def check_paraphrase_column(trainer: Any) -> None:
    """Trainer-construction refusals naming the flag and the fix: the training dataset has the variants column;
    for a `datasets.Dataset` the column is a list column whose lengths lie in `1 .. num_generations` (read from
    the Arrow lengths, not the cells) and whose first row's variants have its prompt's format. Datasets without
    column names (iterable, torch) are checked batch by batch."""
    column = getattr(trainer.args, COLUMN_FLAG)
    dataset = trainer.train_dataset
    names = getattr(dataset, "column_names", None)
    if names is None:
        return
    if column not in names:
        raise ValueError(f"rollout_filter={VARIANT_ID!r} prompts each rollout of a group with one of its row's "
                         f"paraphrases, read from the training dataset's column {COLUMN_FLAG}={column!r}, which it "
                         f"does not have (columns: {sorted(names)}). Add a column holding each row's list of prompt "
                         f"variants (same format as 'prompt') or set {COLUMN_FLAG} to the column that holds them.")
    data = getattr(dataset, "data", None)
    if data is None or not hasattr(dataset, "__getitem__") or len(dataset) == 0:
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    cells = data.column(column)
    if not (pa.types.is_list(cells.type) or pa.types.is_large_list(cells.type)):
        raise ValueError(f"rollout_filter={VARIANT_ID!r}: the training dataset's column {COLUMN_FLAG}={column!r} "
                         f"holds {cells.type}, not lists of prompt variants; give each row a list of prompts in the "
                         "format of its 'prompt' (strings or chat-message lists).")
    lengths = pc.list_value_length(cells).fill_null(0)
    shortest, longest = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    variant_index(0, shortest, trainer.num_generations)  # a row with no variants
    variant_index(0, longest, trainer.num_generations)  # a row with more variants than rollouts per group
    if "prompt" in names:  # without one (an environment's reset() prompts) the rows are refused per batch
        first = dataset[0]
        check_row_variants(first[column], first["prompt"], column, 0)


def assign_paraphrase_prompts(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This process's training rows with each prompt replaced by its group position's variant
    (`consistency_grpo.assign_paraphrases`); the process's rows are global rows `process_index · local_n ...`, so
    no communication is needed. Logs the mean number of variants of the batch's rows."""
    column = getattr(trainer.args, COLUMN_FLAG)
    first_row = trainer.accelerator.process_index * len(inputs)
    rows = assign_paraphrases(inputs, first_row, trainer.num_generations, column)
    if rows:
        mean_variants = sum(len(row[column]) for row in rows) / len(rows)
        trainer._metrics["train"]["groupx/consistency_grpo_variants_per_row"].append(mean_variants)
    return rows
