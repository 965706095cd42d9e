"""GRPO for information consistency: each GRPO group is the rollouts of one dataset row's paraphrased prompts.

The generation change runs in the trainer (`paraphrase_groups.assign_paraphrase_prompts`, called from
`GRPOTrainer._generate_and_score_completions` before TRL's generation, its `before` hook in `generation_hooks.py`):
rollout `j` of every group gets the row's `j mod V`-th prompt variant, so TRL generates, scores and trains every
rollout under its own phrasing and the group statistics of every advantage estimator are over paraphrases. This
module registers the variant, validates its flag and holds the pure parts (which variant each global row gets, the
checks of a row's variants, the rewritten rows).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import get_variant, register

VARIANT_ID = "consistency_grpo"
COLUMN_FLAG = "consistency_grpo_column"
DEFAULT_COLUMN = "paraphrases"
#: Column the rewritten rows carry: the group's index in the generation batch (what `stability_reward` groups by).
PARAPHRASE_ID_COLUMN = "paraphrase_id"
#: Column the rewritten rows carry: the index of the variant the rollout answered (0 .. V-1).
VARIANT_INDEX_COLUMN = "consistency_grpo_variant"


def validate(config: Any) -> None:
    """Config-time refusals naming the flag and the fix (the dataset column itself is checked at trainer
    construction, `paraphrase_groups.check_paraphrase_column`, and each batch's cells before generation)."""
    column = getattr(config, COLUMN_FLAG)
    if not isinstance(column, str) or not column.strip() or column in ("prompt", PARAPHRASE_ID_COLUMN):
        raise ValueError(f"{COLUMN_FLAG}={column!r} must name the dataset column that holds each row's list of "
                         f"prompt variants (default {DEFAULT_COLUMN!r}); not 'prompt' or '{PARAPHRASE_ID_COLUMN}'.")
    if getattr(config, "use_vllm", False) and getattr(config, "vllm_mode", "colocate") == "server":
        raise ValueError(f"rollout_filter={VARIANT_ID!r} gives each rollout of a group its own prompt, and TRL's "
                         "vllm_mode='server' generates all of a group's completions from the group's first prompt. "
                         "Use vllm_mode='colocate' (one completion per row) or use_vllm=False.")
    estimator = getattr(config, "advantage_estimator", "grpo")
    if estimator not in (None, "grpo"):
        keyed = {"prompt_keys", "prompt_kl"} & set(get_variant(estimator).requires)
        if keyed:
            raise ValueError(f"advantage_estimator={estimator!r} keeps per-prompt state keyed by the prompt's tokens "
                             f"({sorted(keyed)}), and rollout_filter={VARIANT_ID!r} gives the rows of one group "
                             "different prompts (the paraphrases). Use another advantage_estimator.")


def variant_positions(first_row: int, num_rows: int, group_size: int) -> list[tuple[int, int]]:
    """`(group, position in group)` of `num_rows` consecutive rows starting at global row `first_row` of a
    generation batch: TRL lays out row `r` as rollout `r mod G` of group `r // G`, and a process's rows are the
    contiguous slice `process_index · local_n + i`, so a group split across processes is numbered the same on all."""
    if group_size < 1 or first_row < 0 or num_rows < 0:
        raise ValueError(f"group_size >= 1, first_row >= 0, num_rows >= 0; got {group_size}, {first_row}, {num_rows}.")
    return [(r // group_size, r % group_size) for r in range(first_row, first_row + num_rows)]


def variant_index(position: int, num_variants: int, group_size: int) -> int:
    """Index of the variant that rollout `position` of a group answers: `position mod V` (`V <= G`, cycled when
    `V < G`). `V > G` is refused: the variants past `G` would never be trained."""
    if num_variants < 1:
        raise ValueError(f"a row needs at least one prompt variant in its {COLUMN_FLAG} column, got none.")
    if num_variants > group_size:
        raise ValueError(f"a row has {num_variants} prompt variants in its {COLUMN_FLAG} column but num_generations="
                         f"{group_size}: each rollout of a group answers one variant, so variants {group_size}.."
                         f"{num_variants - 1} would never be generated. Set num_generations >= {num_variants} "
                         "(a multiple of the variant count gives every variant the same number of rollouts) or "
                         "split the row's variants over several rows.")
    return position % num_variants


def _is_conversation(prompt: Any) -> bool:
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt))


def check_row_variants(variants: Any, prompt: Any, column: str, row: int) -> list[Any]:
    """The row's variants as a list, or `ValueError` naming the flag and the fix: a non-empty list whose items have
    the format of the row's `prompt` (all strings for a text prompt, all chat-message lists for a conversational
    one), as TRL tokenizes them like any prompt."""
    fix = (f"each row's {column!r} cell must be a non-empty list of prompt variants in the format of its 'prompt' "
           "(strings, or lists of {'role', 'content'} messages), e.g. ['2+3=', '3+2=', 'What is 2+3?']; set "
           f"{COLUMN_FLAG} to the column that holds them.")
    if not isinstance(variants, (list, tuple)) or len(variants) == 0:
        raise ValueError(f"rollout_filter={VARIANT_ID!r}: row {row} has {column!r} = {variants!r}; {fix}")
    if isinstance(prompt, str):
        bad = [v for v in variants if not isinstance(v, str) or not v]
        kind = "a text prompt, so every variant must be a non-empty string"
    else:
        bad = [v for v in variants if not _is_conversation(v)]
        kind = "a conversational prompt, so every variant must be a non-empty list of {'role', 'content'} messages"
    if bad:
        raise ValueError(f"rollout_filter={VARIANT_ID!r}: row {row} has {kind}; got {bad[0]!r} in {column!r}. {fix}")
    return list(variants)


def assign_paraphrases(rows: Sequence[dict[str, Any]], first_row: int, group_size: int,
                       column: str = DEFAULT_COLUMN) -> list[dict[str, Any]]:
    """`rows` (global rows `first_row ...` of a generation batch) with each prompt replaced by a fresh copy of its
    variant `position mod V` and the columns `paraphrase_id` (the group index) and `consistency_grpo_variant` (the
    variant index) set. The input rows are not modified."""
    out = []
    for i, (row, (group, position)) in enumerate(
            zip(rows, variant_positions(first_row, len(rows), group_size), strict=True)):
        if "prompt" not in row or column not in row:
            missing = "prompt" if "prompt" not in row else column
            raise ValueError(f"rollout_filter={VARIANT_ID!r}: row {first_row + i} has no {missing!r} column; every "
                             f"training row needs a 'prompt' and its list of prompt variants in the column named by "
                             f"{COLUMN_FLAG} (now {column!r}).")
        variants = check_row_variants(row[column], row["prompt"], column, first_row + i)
        k = variant_index(position, len(variants), group_size)
        out.append({**row, "prompt": copy.deepcopy(variants[k]), PARAPHRASE_ID_COLUMN: group,
                    VARIANT_INDEX_COLUMN: k})
    return out


@register(
    VARIANT_ID,
    name="GRPO for information consistency: groups of paraphrased prompts",
    paper="GRPO for information consistency across paraphrased prompts (prompt variants as groups, context reset), "
          "arXiv:2512.12858",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, COLUMN_FLAG: DEFAULT_COLUMN, "num_generations": 4},
    needs=(f"a dataset column (consistency_grpo_column, default {DEFAULT_COLUMN!r}) holding each row's semantically "
           "equivalent prompt variants, at most num_generations of them; a reward such as stability_reward "
           "(trl_groupx.rewards) that compares the completions sharing a paraphrase_id",),
    params=(COLUMN_FLAG,),
    validate=validate,
)
def consistency_grpo(batch: RolloutBatch) -> torch.Tensor:
    r"""Paraphrase groups of "GRPO for information consistency" (arXiv:2512.12858; catalog id `consistency_grpo`,
    the catalog's `group_key="paraphrase_id"`; here `rollout_filter="consistency_grpo"`,
    `consistency_grpo_column="paraphrases"`).

    A training row carries `V` semantically equivalent prompts `p_0 .. p_{V-1}` in its `consistency_grpo_column`
    (the same format as its `prompt`: strings, or chat-message lists). TRL repeats the row `G = num_generations`
    times; rollout `j` of the group answers variant `k(j) = j mod V`:

        y_j ~ π_θ(· | p_{k(j)}),   r_j = Σ_f w_f r_f(p_{k(j)}, y_j),   j = 0 .. G-1

    and every later stage sees the group as usual, so the group statistics are over the paraphrases: TRL's GRPO
    `A_j = (r_j − mean_g r) / (std_g r + ε)` (or whichever advantage, token and objective stages are set), and the
    log-probs are `log π_θ(y_j | p_{k(j)})`. A group whose completions disagree across phrasings gets a non-zero
    advantage; one whose completions agree gets none, which is what a consistency reward (`stability_reward`:
    `r_i = 1 − (−log p_i) / log n`, `p_i` the group's share of completions with i's information content, compared
    by the `paraphrase_id` column this variant sets) turns into the training signal.

    Shapes: `(N = P·G)` rows as TRL lays them out; `N` rows in, `N` rows out; nothing else changes.

    Source: the paper's abstract ("treating prompt variants as groups and resetting conversational context to
    isolate phrasing effects"; "entropy-based helpfulness and stability rewards"). There is no official code
    (`α·H_norm + β·F_norm`, values not given), so the choices below are ours:

    - Choice: fewer variants than rollouts (`V < G`) cycle: rollout `j` answers `p_{j mod V}`, so with `G` a
      multiple of `V` every variant gets `G / V` rollouts (e.g. 2 variants, G = 4: p0 p1 p0 p1), otherwise the first
      `G mod V` variants get one more. More variants than rollouts (`V > G`) are refused at the first batch (and
      at construction for an Arrow dataset): the extra variants would never be trained, silently.
    - Choice: context reset = each rollout's prompt is a fresh deep copy of its variant alone (no other variant,
      no earlier turn or answer in the conversation); a variant that is a chat list keeps its own system message.
    - Choice: the row's own `prompt` is not generated from in training (only its format is checked against the
      variants; put it among the variants to train it); evaluation generates from the plain `prompt` without any
      rewrite (the user's eval set measures consistency with one row per phrasing and its own `paraphrase_id`).
    - Choice: `paraphrase_id` is set to the group's index in the generation batch (replacing a dataset column of
      that name during training), so `stability_reward` compares exactly the completions GRPO normalises together;
      `consistency_grpo_variant` holds each rollout's variant index. Both reach reward functions as columns.
      `stability_reward` compares the rows of one reward call, i.e. one process: a group split across processes
      (`per_device_train_batch_size · steps_per_generation` not a multiple of `G`) is compared piece by piece;
      keep the per-process generation batch a multiple of `G` for the full comparison.
    - Choice: the position of a rollout in its group comes from its global row index (`process_index · local_n +
      i`), so a group split across processes still gets `p_0 .. p_{G-1}` in order, without communication.
    - Choice: variants must match the `prompt`'s format (text or conversational), refused otherwise.

    Scope: any generation path that generates one completion per row: transformers, vLLM colocate, a
    `rollout_func`, tools. vLLM server mode generates a group from its first prompt and is refused at config
    time; so are advantage variants with per-prompt state keyed by the prompt's tokens (`prompt_keys`,
    `prompt_kl`). ReMax's greedy baseline (`advantage_estimator="remax"`) is generated from the group's first
    rollout's prompt (variant 0).

    This function is the stage's filter on the rewritten batch: it keeps every rollout, so the variant composes with
    every other advantage estimator, token weighting and objective, but not with another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch of paraphrase-group rollouts.

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
