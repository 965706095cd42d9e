"""DaGRPO's Sequence-level Gradient Rectification: inside a group, two responses that a distinctiveness scorer finds
near-identical but that GRPO pushes in opposite directions (one advantage positive, the other negative) are masked,
so their gradients do not cancel on the shared tokens (Distinctiveness-aware GRPO, arXiv:2512.06337; no public code).

The scorer is a component the user supplies, registered by name (recipes resolve components by registered name only):

    from trl_groupx.advantages.dagrpo import register_dagrpo_scorer
    register_dagrpo_scorer("my_scorer", my_scorer)   # (completions, completion_ids) -> (G, G) similarities in [0, 1]
    GRPOConfig(advantage_estimator="dagrpo", dagrpo_scorer="my_scorer", ...)

A scorer receives the responses of one group (decoded texts and token ids, padding dropped) and returns a `G × G`
similarity matrix (`sim[i][j]` in `[0, 1]`, 1 = indistinct; `None` for a pair it cannot score). A scorer that gives
each response a fine-grained quality score `s_i ∈ [0, 1]` (the paper's LLM scorer) is written as
`sim[i][j] = 1 − |s_i − s_j|`. `"token_jaccard"` (built in) is a rule-based toy scorer: the Jaccard overlap of the
two responses' token-id sets. A model-backed scorer is `EmbeddingSimilarityScorer`
(`trl_groupx/advantages/lm_components.py`): the cosine similarity (negative clipped to 0) of the two responses'
mean-pooled last hidden states under any model; register one (`register_dagrpo_scorer("my_scorer",
EmbeddingSimilarityScorer.from_pretrained(path))`) or, from a recipe, name a model:
`dagrpo_scorer: "embedding:<model folder or hub id>"` (built with the defaults on first use).

Off-policy Data Augmentation (the paper's second mechanism, high-quality anchors for hard queries) is GCPO's
reference injection: combine `advantage_estimator="dagrpo"` with `rollout_filter="gcpo_ref"` (a reference solution
from the dataset replaces one rollout of each group whose rollouts all fail; `trl_groupx/sampling/gcpo_ref.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..registry import register
from ._checks import reject_infinite
from .group_norm import group_normalized_advantages
from .lm_components import MODEL_SCORER_PREFIX, EmbeddingSimilarityScorer, ModelNamedJudges

VARIANT_ID = "dagrpo"
SCORER_FLAG = "dagrpo_scorer"

# `embedding:<model>` names an embedding scorer built from that model on first use (recipes cannot register one).
SCORERS = ModelNamedJudges(SCORER_FLAG, "trl_groupx.advantages.dagrpo.register_dagrpo_scorer", MODEL_SCORER_PREFIX,
                           EmbeddingSimilarityScorer.from_pretrained)
register_dagrpo_scorer = SCORERS.register


def token_jaccard_similarity(completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                             **kwargs: Any) -> list[list[float]]:
    """Toy scorer: `sim[i][j] = |T_i ∩ T_j| / |T_i ∪ T_j|` over the token-id sets `T` (two empty responses: 1)."""
    sets = [set(ids) for ids in completion_ids]
    return [[len(a & b) / len(a | b) if a | b else 1.0 for b in sets] for a in sets]


register_dagrpo_scorer("token_jaccard", token_jaccard_similarity)


def _validate(config) -> None:
    SCORERS.check(config.dagrpo_scorer)
    tau = config.dagrpo_similarity_threshold
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not math.isfinite(tau) or not 0 < tau <= 1:
        raise ValueError(f"dagrpo_similarity_threshold must lie in (0, 1] (a pair with similarity >= it and "
                         f"opposite advantages is masked; e.g. 0.9), got {tau!r}.")
    for flag in ("num_generations", "num_generations_eval"):
        g = getattr(config, flag, None)
        if g is not None and g < 2:
            raise ValueError(f"advantage_estimator='dagrpo' compares pairs of responses in a group: {flag}={g} "
                             "leaves one response per group; use num_generations >= 2.")


def indistinct_rows(advantages: torch.Tensor, similarity: torch.Tensor, group_size: int,
                    threshold: float) -> torch.Tensor:
    """`(N,)` bool: rows in at least one indistinct pair `(i, j)`, `i ≠ j` of one group, with `sim_ij ≥ threshold`
    and `A_i · A_j < 0` (NaN similarity: not indistinct). `similarity` is `(N/G, G, G)`."""
    a = advantages.view(-1, group_size)
    opposite = (a[:, :, None] * a[:, None, :]) < 0
    close = torch.nan_to_num(similarity.to(a.dtype), nan=-1.0) >= threshold
    off_diagonal = ~torch.eye(group_size, dtype=torch.bool, device=a.device)
    return (opposite & close & off_diagonal).any(dim=2).flatten()


@register(
    VARIANT_ID,
    name="DaGRPO (Distinctiveness-aware GRPO): masking of near-identical response pairs with opposite advantages",
    paper="DaGRPO: Rectifying Gradient Conflict in Reasoning via Distinctiveness-Aware Group Relative Policy "
          "Optimization, arXiv:2512.06337",
    official_code=None,
    stage="advantages",
    # The toy scorer makes the flags runnable anywhere; a real run names its own (LLM) scorer.
    flags={"advantage_estimator": VARIANT_ID, SCORER_FLAG: "token_jaccard", "dagrpo_similarity_threshold": 0.9},
    params=(SCORER_FLAG, "dagrpo_similarity_threshold"),
    needs=(("a distinctiveness scorer registered with register_dagrpo_scorer and named by dagrpo_scorer: "
            "(completions, completion_ids) of one group -> (G, G) similarities in [0, 1]"),),
    requires=("pair_similarity",),
    validate=_validate,
)
def dagrpo_advantages(
    rewards: torch.Tensor, group_size: int, *, pair_similarity: torch.Tensor | None = None,
    dagrpo_similarity_threshold: float = 0.9, scale_rewards: str = "group",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""GRPO advantages with DaGRPO's sequence-level gradient rectification.

    Per group of `G` responses with rewards `r_i`:

    - `A_i = (r_i − mean_g r) / (std_g r + 1e-4)`: GRPO's advantage exactly as TRL computes it
      (`group_normalized_advantages`, TRL's `scale_rewards`; NaN rewards get 0 and leave the statistics);
    - a pair `(i, j)`, `i ≠ j`, is *indistinct* when `sim_ij ≥ τ` (`τ = dagrpo_similarity_threshold`, `sim` from the
      scorer) and `A_i · A_j < 0`: near-identical sequences pushed in opposite directions, whose gradients conflict;
    - every row in at least one indistinct pair is masked: `Ã_i = 0` and `keep_i = False` (the trainer gives it no
      loss tokens); the other rows keep `Ã_i = A_i`.

    A batch without an indistinct pair gets GRPO's numbers bit for bit.

    Shapes: `rewards (N,)`, `pair_similarity (N/G, G, G)` (NaN where unscored, and in evaluation) →
    `(advantages (N,), keep (N,) bool)`.

    Citation: arXiv:2512.06337 (abstract: "Sequence-level Gradient Rectification, which utilizes fine-grained
    scoring to dynamically mask sample pairs with low distinctiveness, thereby eradicating gradient conflicts at the
    source"; catalog row `dagrpo`, seed 004_65d2611f32946cb1.txt ¶108: "two near-identical completions with opposite
    advantages → pair masked"; official-code.md: no code, LLM scorer). Only abstract pages of the paper were
    readable here, so the rule's details are ours:

    Choice: distinctiveness is a pairwise similarity `sim_ij ∈ [0, 1]` from a registered scorer (a per-response
    fine-grained score `s_i` enters as `1 − |s_i − s_j|`); a pair is masked when `sim_ij ≥ τ` with `τ = 0.9`
    (the paper's value was not readable). Choice: only pairs with opposite advantage signs are masked (a pair with
    equal signs pushes both sequences the same way: no conflict; an advantage of 0 conflicts with nothing).
    Choice: masking a pair drops both rows from the update (advantage 0 and no loss tokens, as a summary reads
    "filter low-distinctiveness samples"); the group statistics are GRPO's over all rows (the masked rows are not
    re-normalised away), so the surviving rows keep GRPO's advantages. Choice: the scorer sees completions only,
    one group at a time; evaluation batches are not scored (nothing is masked there).

    Edge cases: `G = 1` raises (also refused at config construction); `G = 2`: the two rows of a mixed group have
    opposite advantages, so they are masked together when `sim ≥ τ`; an all-equal group has all advantages 0 and
    nothing to mask; ±inf rewards raise; a similarity outside `[0, 1]` raises naming `dagrpo_scorer`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups contiguous, NaN where unscored.
        group_size (`int`): `G`.
        pair_similarity (`torch.Tensor`, *optional*): `(N/G, G, G)` scorer similarities, filled by the trainer
            (requirement `pair_similarity`). `None`: nothing masked.
        dagrpo_similarity_threshold (`float`): `τ`.
        scale_rewards (`str`): TRL's `scale_rewards`.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: `(N,)` finite advantages and the `(N,)` bool keep mask.
    """
    if group_size < 2:
        raise ValueError(f"advantage_estimator='dagrpo' needs groups of at least two responses (group_size="
                         f"{group_size}); use num_generations >= 2.")
    reject_infinite(rewards, VARIANT_ID)
    advantages = group_normalized_advantages(rewards, group_size, scale_rewards=scale_rewards)
    keep = torch.ones(rewards.numel(), dtype=torch.bool, device=rewards.device)
    if pair_similarity is None:
        return advantages, keep
    sim = pair_similarity.to(device=rewards.device, dtype=torch.float64)
    if sim.shape != (rewards.numel() // group_size, group_size, group_size):
        raise ValueError(f"{SCORER_FLAG}: pair_similarity has shape {tuple(sim.shape)}, expected "
                         f"{(rewards.numel() // group_size, group_size, group_size)} (one G x G matrix per group).")
    scored = sim[~torch.isnan(sim)]
    if ((scored < 0) | (scored > 1)).any():
        bad = scored[(scored < 0) | (scored > 1)].tolist()[:5]
        raise ValueError(f"{SCORER_FLAG}: the scorer returned similarities {bad}; similarities must lie in [0, 1] "
                         "(None for a pair it cannot score).")
    masked = indistinct_rows(advantages, sim, group_size, dagrpo_similarity_threshold)
    return advantages.masked_fill(masked, 0.0), keep & ~masked


def pair_similarity_for_batch(trainer: Any, output: dict[str, Any], rewards: torch.Tensor,
                              group_size: int) -> torch.Tensor:
    """Trainer glue of requirement `pair_similarity`: global `(N/G, G, G)` float32 similarities (NaN in evaluation).

    A group may span processes, so every process gathers the completion ids (padded); group `g` is scored by process
    `g mod P` only and the matrices are summed over processes (zeros elsewhere), which gives every process the
    same tensor (the trainer logs the kept share as `groupx/advantage_kept_fraction`)."""
    n_groups = rewards.numel() // group_size
    sim = torch.full((n_groups, group_size, group_size), float("nan"), dtype=torch.float32)
    if not trainer.model.training:
        return sim
    acc = trainer.accelerator
    ids = trainer._gather_padded(output["completion_ids"]).cpu()
    mask = trainer._gather_padded(output["completion_mask"]).cpu().bool()
    scorer = SCORERS.get(trainer.args.dagrpo_scorer)
    local = torch.zeros((n_groups, group_size, group_size), dtype=torch.float32)
    for g in range(acc.process_index, n_groups, acc.num_processes):
        rows = range(g * group_size, (g + 1) * group_size)
        group_ids = [ids[i][mask[i]].tolist() for i in rows]
        texts = trainer.processing_class.batch_decode(group_ids, skip_special_tokens=True)
        matrix = [list(r) for r in scorer(completions=texts, completion_ids=group_ids)]
        if len(matrix) != group_size or any(len(r) != group_size for r in matrix):
            raise ValueError(f"{SCORER_FLAG}={trainer.args.dagrpo_scorer!r}: the scorer must return a "
                             f"{group_size} x {group_size} matrix for a group of {group_size} completions.")
        local[g] = torch.tensor([[float("nan") if v is None else float(v) for v in r] for r in matrix])
    if acc.num_processes > 1:
        local = acc.gather(local[None].to(acc.device)).cpu().sum(0)  # (P, n, G, G) -> (n, G, G)
    return local
