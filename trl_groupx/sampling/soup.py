"""SOUP (Single-sample Mix-pOlicy Unified Paradigm): some rollouts of a group start with the prefix of a rollout an
earlier policy sampled for the same prompt and are continued on-policy; token-level importance ratios correct the
off-policy prefix.

The trainer glue (`soup_glue.py`) generates the mixed rows in TRL's own generation call (`generate_with_prefixes`)
and gives them their behaviour log-probs after scoring (`mix_prefix_rollouts`); this module registers the variant,
validates its flags, holds the pure parts (the prefix of a stored rollout, which slots are mixed and which are
stored, the per-token behaviour log-probs of a mixed row) and is the stage's filter, which keeps every rollout.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register
from . import keep_all

VARIANT_ID = "soup"


def validate(config: Any) -> None:
    """Config-time refusals naming the flag and the fix."""
    k, group_size = config.soup_mixed_rollouts, config.num_generations
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= group_size:
        raise ValueError(f"soup_mixed_rollouts={k!r}: use an integer in [1, num_generations={group_size}], the "
                         "rollouts per group that continue an earlier policy's prefix (default 1).")
    f = config.soup_prefix_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0.0 <= f < 1.0:
        raise ValueError(f"soup_prefix_fraction={f!r}: use a fraction in [0, 1) of the stored rollout's tokens that "
                         "the mixed rollout keeps as its off-policy prefix (default 0.5; 0 trains plain GRPO).")
    if getattr(config, "use_vllm", False):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} continues stored prefixes with the trainer's transformers "
                         "generator; vLLM is not wired for it. Set use_vllm=False.")
    if getattr(config, "edge_grpo_gec", False):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} and edge_grpo_gec=True both rewrite rollouts after "
                         "generation (a mixed row's prefix would be corrected as if the policy had sampled it); drop "
                         "one of the two.")


# ---- pure parts ----------------------------------------------------------------------------------------------------


def prefix_length(completion_length: int, ends_with_eos: bool, fraction: float) -> int:
    """Tokens kept from a stored rollout: `m = ⌊f · n⌋`, `n` its tokens before a final EOS (an EOS never starts the
    continuation)."""
    n = completion_length - int(bool(ends_with_eos) and completion_length > 0)
    return int(math.floor(fraction * max(n, 0)))


def stored_slots(group_size: int, k: int) -> list[int]:
    """Slots of a group whose on-policy rollouts are stored for the prompt's next visit: the first `k` (`0 … k−1`)."""
    return list(range(min(k, group_size)))


def mixed_slots(group_size: int, k: int) -> list[int]:
    """Slots of a group that continue a stored prefix: the last `k` (`G−k … G−1`)."""
    return list(range(group_size - min(k, group_size), group_size))


def mixed_behaviour_logps(current: torch.Tensor, stored_prefix: torch.Tensor) -> torch.Tensor:
    """`(T,)` behaviour log-probs of a mixed row: the stored sampling log-probs `log π_hist(y_t)` on the prefix
    `t < m` and the current policy's `log π_old(y_t)` on the continuation, so TRL's ratio `exp(log π_θ − b_t)` is
    `π_θ/π_hist` on the prefix and `π_θ/π_old` after it."""
    m = stored_prefix.numel()
    if m > current.numel():
        raise ValueError(f"A stored prefix of {m} tokens does not fit a mixed row of {current.numel()} tokens.")
    out = current.clone()
    out[:m] = stored_prefix.to(current)
    return out


@register(
    VARIANT_ID,
    name="SOUP (Single-sample Mix-pOlicy Unified Paradigm): off-policy prefix, on-policy continuation",
    paper="SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large Language Models, "
          "arXiv:2601.21476",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "soup_mixed_rollouts": 1, "soup_prefix_fraction": 0.5},
    params=("soup_mixed_rollouts", "soup_prefix_fraction"),
    stateful=True,
    validate=validate,
)
def soup(batch: RolloutBatch, *, state: dict) -> torch.Tensor:
    r"""SOUP: within one rollout, an off-policy prefix from a historical policy and an on-policy continuation.

    Source: the paper's abstract (arXiv:2601.21476; no official code; the method section was not retrievable here):
    "It confines off-policy influence to the prefix of a generated sequence sampled from historical policies, while
    the continuation is generated on-policy. Through token-level importance ratios, SOUP effectively leverages
    off-policy information". Everything below that is not in that sentence is **our choice**:

    - Historical policy (**choice**): the policy of the prompt's previous visit. Per prompt (keyed by its token ids,
      as RePO's buffer), the state keeps the prefixes of the first `k = soup_mixed_rollouts` on-policy rollouts of
      its latest group (`stored_slots`), with their sampling log-probs (TRL's `old_per_token_logps`, or the
      current policy's when the batch is on-policy); only the prefix is stored, `m = ⌊f · n⌋` tokens of the rollout's
      `n` tokens before a final EOS (`prefix_length`, `f = soup_prefix_fraction`, **choice** 0.5).
    - Mixed rollouts (**choice**): on a prompt's next visit, the last `k` slots of its group (`mixed_slots`) are
      stored prefix `j` + the current policy's continuation of `prompt + prefix`, generated in TRL's own call for
      the batch (the run's sampling settings and `max_completion_length` budget, cut to `max_completion_length`)
      and scored by TRL with the other rows; a prompt seen for the first time, or whose stored prefixes are empty,
      keeps its on-policy rollouts. The stored prefixes are then replaced by this visit's (its first `k` rows).
    - Importance ratios (**choice**: the abstract's "token-level importance ratios", read as PPO's per-token ratio
      against the token's own behaviour policy): a mixed row's `old_per_token_logps` are `log π_hist` on the prefix
      and `log π_old` (the generating policy) on the continuation (`mixed_behaviour_logps`), so its prefix tokens
      train with `π_θ/π_hist` and its continuation with `π_θ/π_old`, both clipped by the run's objective as usual.
      When TRL keeps no old log-probs (an on-policy batch), the batch gets them as soon as a row is mixed: the
      current policy's for every other row (ratio 1, TRL's detached default).
    - The group's advantages are GRPO's over all G rollouts, mixed ones included (**choice**), computed after the
      rewrite by the advantage stage.
    - `f = 0` stores no prefix, mixes no row, and trains exactly as GRPO (tested).

    Metrics: `groupx/soup_mixed_rows`, `groupx/soup_prefix_tokens_mean` (over mixed rows).

    Scope: single-turn text generation with transformers (vLLM refused at config construction; rollout_func, tools
    and environments at trainer construction); training batches only. The buffer holds one prefix and its log-probs per stored
    slot and prompt (CPU memory and checkpoint size grow with the dataset: about `k · f · L` tokens per prompt).

    State (saved with every checkpoint, identical on every process): `prompts`: prompt key → `{"ids": [(m_j,)
    int64], "logps": [(m_j,) float32]}`.

    Args:
        batch (`RolloutBatch`): the global batch after the rewrite (the flags are read by the trainer glue).
        state (`dict`): the prefix buffer (see above; updated by the trainer glue).

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    return keep_all(batch, VARIANT_ID)
