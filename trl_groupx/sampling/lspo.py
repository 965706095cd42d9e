"""LSPO (LoRA Scaffolded Policy Optimization): cliff groups re-rolled by a throw-away LoRA scaffold fitted to their
reference solutions, the successful re-rolls spliced into the batch with an importance-sampling correction.

The re-roll runs in the trainer (`lspo_scaffold.scaffold_cliff_groups`, called from
`GRPOTrainer._generate_and_score_completions` after TRL's generation and scoring, before the other stages); this
module registers the variant, validates its flags, holds the pure parts (cliff detection, splice selection, the
truncated behaviour log-probs) and is the stage's filter, which keeps every rollout.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register
from . import keep_all

VARIANT_ID = "lspo"
#: Name of the throw-away adapter (LoRA policies: a second adapter on the policy's base model).
SCAFFOLD_ADAPTER = "lspo_scaffold"


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def validate(config: Any) -> None:
    """Config-time refusals naming the flag and the fix."""
    column = config.lspo_column
    if not isinstance(column, str) or not column:
        raise ValueError(f"lspo_column={column!r}: name the dataset column that holds each prompt's ground-truth "
                         "solution, the scaffold's SFT target (e.g. lspo_column='solution').")
    if not _is_number(config.lspo_success_threshold):
        raise ValueError(f"lspo_success_threshold={config.lspo_success_threshold!r}: use a finite number; a rollout "
                         "whose reward is at least this value counts as solved (1.0 for 0/1 accuracy rewards).")
    for flag in ("lspo_lora_r", "lspo_sft_steps"):
        value = getattr(config, flag)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{flag}={value!r}: use an integer >= 1 (defaults: lspo_lora_r 16, lspo_sft_steps 1).")
    for flag in ("lspo_lora_alpha", "lspo_sft_learning_rate", "lspo_is_cap"):
        value = getattr(config, flag)
        if not _is_number(value) or value <= 0:
            raise ValueError(f"{flag}={value!r}: use a finite number > 0 (defaults: lspo_lora_alpha 32, "
                             "lspo_sft_learning_rate 1e-4, lspo_is_cap 1.0).")
    template = config.lspo_template
    if not isinstance(template, str) or "{ref}" not in template:
        raise ValueError(f"lspo_template={template!r} must contain '{{ref}}', where the solution goes in the SFT "
                         "target (default '{ref}': the column's text as it is).")
    if getattr(config, "use_vllm", False):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} re-rolls cliff groups with a LoRA scaffold through "
                         "transformers `generate`; vLLM would sample from the policy without it. Set use_vllm=False.")


# ---- pure parts ----------------------------------------------------------------------------------------------------


def cliff_groups(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """`(N/G,)` bool: cliff groups, i.e. at least one scored rollout and every scored reward `< threshold`.

    NaN rewards are unscored: they neither solve a group nor make it a cliff on their own (an all-NaN group is not
    a cliff: nothing says its rollouts failed). ±inf rewards raise."""
    if torch.isinf(rewards).any():
        raise ValueError(f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values "
                         "or NaN.")
    grouped = rewards.view(-1, group_size)
    scored = ~torch.isnan(grouped)
    solved = scored & (grouped >= threshold)
    return scored.any(dim=1) & ~solved.any(dim=1)


def splice_rows(rows: torch.Tensor, scaffold_rewards: torch.Tensor, group_size: int, threshold: float) -> list[int]:
    """Global rows whose rollout is replaced by its scaffold re-roll.

    `rows` `(M,)`: the global rows of the cliff groups that were re-rolled (one scaffold completion each, in the
    row's own slot); `scaffold_rewards` `(M,)`: their weighted rewards (NaN = unscored = not successful). Per
    group, the successful re-rolls in slot order, at most `group_size - 1` of them, so that at least one of the
    policy's own failed rollouts stays in the group and its advantages are not all zero."""
    chosen: list[int] = []
    taken: dict[int, int] = {}
    order = torch.argsort(rows)
    for k in order.tolist():
        row, reward = int(rows[k]), float(scaffold_rewards[k])
        group = row // group_size
        if math.isnan(reward) or reward < threshold or taken.get(group, 0) >= group_size - 1:
            continue
        taken[group] = taken.get(group, 0) + 1
        chosen.append(row)
    return chosen


def truncated_behaviour_logps(scaffold_logps: torch.Tensor, current_logps: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token behaviour log-probs `b_t = max(log π_s(y_t), log π_θ(y_t) − log C)` of spliced rows.

    Stored as `old_per_token_logps`, they make TRL's ratio at generation time `exp(log π_θ − b) =
    min(π_θ / π_s, C)` per token: the truncated importance weight of a token sampled by the scaffold `π_s` and
    trained on the policy `π_θ` (`C = lspo_is_cap`). During the update the ratio moves from there with `π_θ` and
    is clipped by the objective as for every row."""
    return torch.maximum(scaffold_logps, current_logps - math.log(cap))


@register(
    VARIANT_ID,
    name="LSPO (LoRA Scaffolded Policy Optimization): cliff groups re-rolled by a throw-away LoRA scaffold",
    paper="LoRA Scaffolded Policy Optimization, arXiv:2607.27787",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "lspo_column": "solution", "lspo_success_threshold": 1.0,
           "lspo_lora_r": 16, "lspo_lora_alpha": 32.0, "lspo_sft_steps": 1, "lspo_sft_learning_rate": 1e-4,
           "lspo_is_cap": 1.0, "lspo_template": "{ref}"},
    params=("lspo_column", "lspo_success_threshold", "lspo_lora_r", "lspo_lora_alpha", "lspo_sft_steps",
            "lspo_sft_learning_rate", "lspo_is_cap", "lspo_template"),
    needs=("ground-truth solution column",),
    validate=validate,
)
def lspo(batch: RolloutBatch) -> torch.Tensor:
    r"""LSPO's cliff rescue (arXiv:2607.27787, NVIDIA; the catalog's `cliff_rescue="lora_scaffold"`).

    Each training generation batch:

    1. cliff groups: at least one scored rollout and every scored reward `r_j < τ` (`τ = lspo_success_threshold`,
       `r` the weighted reward sum, NaN unscored; `cliff_groups`);
    2. a throw-away LoRA scaffold `π_s` is fitted by `lspo_sft_steps` AdamW steps (lr `lspo_sft_learning_rate`,
       no weight decay) of token-mean NLL on the cliff prompts' ground-truth solutions
       `tokenize(template(solution)) + EOS` (`lspo_column`, `lspo_template`, cut to `max_completion_length`);
    3. every rollout slot of a cliff group is re-rolled once by the scaffold (TRL's own generator, the run's
       sampling settings) and scored by the run's reward functions;
    4. the successful re-rolls (`r ≥ τ`) replace the rollout in their slot, at most `G − 1` per group
       (`splice_rows`); their rewards enter the advantage stage, which runs on the updated batch;
    5. importance sampling: a spliced row's `old_per_token_logps` are `b_t = max(log π_s(y_t), log π_θ(y_t) −
       log C)` (`truncated_behaviour_logps`, `C = lspo_is_cap`), so TRL's ratio is the truncated weight
       `min(π_θ/π_s, C)` per token at the first update;
    6. the GRPO step updates the policy only; the scaffold is deleted before the batch is returned, so no
       checkpoint ever holds it.

    Sources: the paper's abstract only (no official code). Every detail below is our choice:

    - Choice: the scaffold is fresh every batch (the abstract's "discarded at checkpoint" could also mean one
      adapter kept across steps; a fresh one keeps it throw-away and makes resumption trivial). LoRA policy: the
      scaffold is a second adapter on the same base, initialised as a copy of the policy adapter (its LoRA config,
      so `lspo_lora_r` / `lspo_lora_alpha` do not apply), so `π_s` starts as `π_θ` and only the SFT moves it.
      Full fine-tuning: a LoRA adapter (`lspo_lora_r`, `lspo_lora_alpha`, all linear layers, B = 0 at init, A
      seeded from `seed + global_step` so all processes agree) on a frozen deep copy of the policy; this costs one
      extra copy of the model's weights while the batch is re-rolled. ZeRO-3 and FSDP are refused (the copy and the
      SFT need whole parameters).
    - Choice: every process fits the scaffold on the same gathered set of cliff pairs (one per cliff group, in
      group order), with the same initialisation, so the scaffolds are identical without an all-reduce; the SFT
      forward runs at temperature 1 on the unwrapped model, in chunks of `per_device_train_batch_size`.
    - Choice: one scaffold re-roll per slot of a cliff group (G per group), the successful ones spliced in their
      own slot, at most `G − 1`, so a group keeps a failed rollout and a non-zero advantage; unsuccessful re-rolls
      are dropped and the policy's rollout stays.
    - Choice: the IS correction is token-level and truncated above at `C = 1` by default: tokens the policy already
      prefers to the scaffold count as on-policy, the others are down-weighted by `π_θ/π_s`. With
      `importance_sampling_level="sequence"` TRL averages the truncated log-ratios over the row's tokens.
    - Choice: a re-roll without EOS is masked under `mask_truncated_completions` (TRL's rule); reference
      log-probs (beta > 0) of spliced rows are recomputed under the reference model.
    - When TRL keeps no old log-probs (on-policy batches), the batch gets them as soon as a row is spliced: the
      current policy's for the other rows (ratio 1, as TRL's detached default), `b_t` for the spliced ones. On
      later micro-steps of the same generation batch (`num_iterations > 1`, `steps_per_generation > 1`) the ratio
      of a spliced token is `π_θ'/π_b`, clipped by the objective like any off-policy row.
    - TRL's logged `reward` metrics and completions table show the batch as generated, before the splice.
    - Metrics: `groupx/lspo_cliff_groups`, `groupx/lspo_scaffold_success` (share of re-rolls that succeed),
      `groupx/lspo_spliced_rows`, `groupx/lspo_sft_loss` (last SFT step's loss).

    Scope: single-turn text generation with transformers (vLLM refused at config construction; rollout_func, tools
    and environments at trainer construction, as is a dataset without `lspo_column`; a cliff prompt with an empty
    solution raises on every process). Training only: evaluation batches are left as generated.

    This function is the stage's filter on the spliced batch: it keeps every rollout, so the stage composes with
    every advantage estimator, token weighting and objective, but not with another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch after the splice (the flags are read by the trainer glue).

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    return keep_all(batch, VARIANT_ID)
