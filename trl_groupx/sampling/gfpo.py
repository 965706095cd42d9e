"""GFPO: Group Filtered Policy Optimization (arXiv:2508.09726): sample more, train on the k best per group."""

from __future__ import annotations

import torch

from ..contracts import RolloutBatch
from ..registry import register

GFPO_METRICS = ("length", "reward_per_token")


def parse_adaptive_keep(value: str | list[int] | tuple[int, ...]) -> list[int]:
    """`"8,8,6,4"` (the config string) or a sequence → `[8, 8, 6, 4]`; `ValueError` naming the flag otherwise."""
    try:
        keeps = [int(x) for x in (value.split(",") if isinstance(value, str) else value)]
    except (TypeError, ValueError):
        keeps = []
    if len(keeps) != 4 or min(keeps) < 1:
        raise ValueError(
            "gfpo_adaptive_keep must be 4 comma-separated integers >= 1 (k for success rate in [0, .25), [.25, .5), "
            f"[.5, .75), [.75, 1]; paper: '8,8,6,4' of 16), got {value!r}."
        )
    return keeps


def _validate(config) -> None:
    if config.gfpo_metric not in GFPO_METRICS:
        raise ValueError(f"gfpo_metric must be one of {GFPO_METRICS}, got {config.gfpo_metric!r}.")
    if not (isinstance(config.gfpo_keep, int) and config.gfpo_keep >= 1):
        raise ValueError(f"gfpo_keep must be an integer >= 1 (responses kept per group), got {config.gfpo_keep!r}.")
    if config.gfpo_adaptive:
        if max(parse_adaptive_keep(config.gfpo_adaptive_keep)) >= config.num_generations:
            raise ValueError(
                f"gfpo_adaptive_keep ({config.gfpo_adaptive_keep!r}) must stay below num_generations "
                f"({config.num_generations}): GFPO keeps k < G' of each group."
            )
    elif config.gfpo_keep >= config.num_generations:
        raise ValueError(
            f"gfpo_keep ({config.gfpo_keep}) must be smaller than num_generations ({config.num_generations}): GFPO "
            "samples a larger group G' = num_generations and keeps k < G' of it (paper: k=8 of G'=16)."
        )


def keep_k_best(scores: torch.Tensor, valid: torch.Tensor, group_size: int, k: int | torch.Tensor) -> torch.Tensor:
    """`(N,)` bool: in every contiguous group, the `k` rollouts with the SMALLEST score among `valid` ones.

    `k` is an int or a `(M,)` tensor (one per group).
    Invalid rollouts rank after every valid one. Ties go to the lower index in the group (stable sort on the
    score, so the order is deterministic and independent of the device). Vectorised over groups.
    """
    n = scores.numel()
    g = group_size
    s = torch.where(valid, scores.double(), torch.tensor(float("inf"), dtype=torch.float64)).view(-1, g)
    # stable sort by (invalid, score, index): sort on the score first, then stable-sort on the validity flag
    order = torch.sort(s, dim=1, stable=True).indices
    inval = (~valid).view(-1, g).gather(1, order).to(torch.int8)
    order = order.gather(1, torch.sort(inval, dim=1, stable=True).indices)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(g).expand_as(order).contiguous())
    k = torch.as_tensor(k).clamp(max=g).view(-1, 1) if torch.is_tensor(k) else min(k, g)
    keep = (rank < k) & valid.view(-1, g)
    return keep.view(n)


@register(
    "gfpo",
    name="GFPO (Group Filtered Policy Optimization)",
    paper="Sample More to Think Less: Group Filtered Policy Optimization for Concise Reasoning, arXiv:2508.09726",
    official_code="huggingface/trl@b6ff4a780e364a92c27165d2fcdb7154bbf1b564:trl/experimental/gfpo/gfpo_trainer.py",
    stage="sampling",
    flags={"rollout_filter": "gfpo", "gfpo_keep": 8, "gfpo_metric": "length", "num_generations": 16,
           "generation_batch_size": 16},
    params=("gfpo_keep", "gfpo_metric", "gfpo_adaptive", "gfpo_adaptive_keep"),
    validate=_validate,
)
def gfpo_filter(
    batch: RolloutBatch,
    *,
    gfpo_keep: int = 8,
    gfpo_metric: str = "length",
    gfpo_adaptive: bool = False,
    gfpo_adaptive_keep: str | list[int] = "8,8,6,4",
) -> torch.Tensor:
    r"""GFPO: from each group of `G' = num_generations` rollouts keep the `k = gfpo_keep` best, drop the rest.

    Score per rollout `i` with completion length `|o_i|` and reward `r_i`:

    - `gfpo_metric="length"`: keep the `k` shortest (smallest `|o_i|`);
    - `gfpo_metric="reward_per_token"` (token efficiency): keep the `k` largest `r_i / max(|o_i|, 1)`.

    Shapes: `batch.rewards` and `batch.completion_lengths` are `(N,)`, `N = M·G'` with groups contiguous; returns
    `keep (N,)` bool with exactly `min(k, #scored in group)` True per group.

    The trainer then gives dropped rollouts completion mask 0 and advantage 0, recomputes `num_items_in_batch`
    over the kept tokens, and computes the advantage stage over the kept set only (dropped rollouts enter it as
    NaN rewards). With the default advantage this is `A_i = (r_i − mean_S(r)) / (std_S(r) + 1e-4)` over the kept
    set `S` (|S| = k).

    Citation: arXiv:2508.09726 (advantage normalised over the retained set `S` with the population std, rejected
    responses kept with `A = 0`, as recorded in /work/shared/official-code.md); the authors' code is not public. Reference implementation read: TRL's community GFPO trainer (since removed),
    huggingface/trl@b6ff4a780e364a92c27165d2fcdb7154bbf1b564:trl/experimental/gfpo/gfpo_trainer.py,
    `GFPOTrainer._generate_and_score_completions` l.329-374 (top-k of a user `group_filter_func` score per group
    with `torch.topk`, then mean and unbiased std over the retained rewards).

    Differences from the paper, stated precisely:

    - Std: the paper normalises with the POPULATION std over `S`; our default advantage stage (TRL's formula) uses
      the UNBIASED std (divisor `k − 1`) plus `eps = 1e-4`, as TRL's removed GFPO trainer did. Hence, up to eps,
      `A_ours = A_paper · sqrt((k − 1)/k)` (0.935 at k = 8, 0.866 at k = 4); the direction of every update is the
      same, its size is scaled by that constant per run (absorbed by the learning rate). Compose with another
      `advantage_estimator` to change it.
    - Rejected responses: the paper keeps them with `A = 0`; our seam gives them `A = 0` AND completion mask 0, so
      their tokens also leave the loss normaliser (as in TRL's removed trainer, which dropped them). With a
      token-count normaliser (`dapo`, `bnpo`: `num_items_in_batch`) the loss is divided by the kept tokens instead
      of the tokens of all `G'` responses, so the update is larger by (all tokens / kept tokens) than the paper's;
      the direction is the same.
    - The filter also runs on evaluation batches (it does not know the mode); TRL's trainer filtered in training
      only.

    Choices the paper leaves open:

    - Ties (equal lengths or equal reward/token): the lower index within the group wins (stable sort). The
      rollouts of a group are i.i.d. samples, so this is an unbiased tie-break.
    - Unscored rollouts (NaN reward) are never kept (they carry no advantage signal) and never take a slot: a group
      with fewer than `k` scored rollouts keeps all its scored ones.
    - Empty completions (length 0): `length` ranks them shortest (kept first); `reward_per_token` divides by
      `max(|o|, 1)`, i.e. counts them as one token.
    - `k ≥ G` (e.g. an evaluation group smaller than the training one, or G = 1): every scored rollout is kept.
    - ±inf rewards raise `ValueError` (the reward-per-token ranking and the advantage would be meaningless).

    Adaptive Difficulty GFPO (`gfpo_adaptive=True`, a simplification): `k_g` per group from the group's success
    rate `p_g` = mean of its scored rewards (rewards must lie in [0, 1]): `k_g = gfpo_adaptive_keep[b]` with bucket
    `b = min(⌊4 p_g⌋, 3)`, i.e. `p ∈ [0, .25) → 8`, `[.25, .5) → 8`, `[.5, .75) → 6`, `[.75, 1] → 4` with the
    paper's `8 8 6 4` (harder prompts keep more). The paper instead buckets by the QUARTILES of a running
    (t-digest) distribution of prompt difficulty over training, with a warm-up at k = 8; we use fixed success-rate
    bins, no running state and no warm-up (our choice: stateless, identical on every process and on resume). It
    coincides with the paper when the running difficulty quartiles sit at .25/.5/.75. `gfpo_keep` is ignored then.

    Paper hyper-parameters: G' = 16, k = 8 (length, reward/token); also k = 4 of G' = 24; AD-GFPO k = 8/8/6/4.

    Args:
        batch (`RolloutBatch`): global rewards, completion lengths and group size.
        gfpo_keep (`int`): `k`, responses kept per group.
        gfpo_metric (`str`): `"length"` or `"reward_per_token"`.
        gfpo_adaptive (`bool`): Adaptive Difficulty GFPO (k per group from its success rate).
        gfpo_adaptive_keep (`str`): comma-separated k for success rate in [0,.25), [.25,.5), [.5,.75), [.75,1].

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask.
    """
    rewards, lengths, g = batch.rewards, batch.completion_lengths, batch.group_size
    if torch.isinf(rewards).any():
        raise ValueError("rollout_filter='gfpo' got ±inf rewards; reward functions must return finite values or NaN.")
    if gfpo_metric not in GFPO_METRICS:
        raise ValueError(f"gfpo_metric must be one of {GFPO_METRICS}, got {gfpo_metric!r}.")
    lengths = lengths.to(rewards.device).double()
    valid = ~torch.isnan(rewards)
    if gfpo_metric == "length":
        scores = lengths
    else:  # larger reward per token is better: sort on its negation
        scores = -(rewards.double() / lengths.clamp(min=1))
    k: int | torch.Tensor = gfpo_keep
    if gfpo_adaptive:
        scored = rewards[valid]
        if scored.numel() and (scored.min() < 0 or scored.max() > 1):
            raise ValueError(
                "gfpo_adaptive=True buckets groups by success rate and needs rewards in [0, 1]; got values in "
                f"[{scored.min().item():g}, {scored.max().item():g}]. Rescale the rewards or set gfpo_adaptive=False."
            )
        r = torch.nan_to_num(rewards.double(), nan=0.0).view(-1, g)
        p = r.sum(1) / valid.view(-1, g).sum(1).clamp(min=1)
        bucket = (p * 4).floor().long().clamp(0, 3)
        k = torch.tensor(parse_adaptive_keep(gfpo_adaptive_keep), device=bucket.device)[bucket]
    return keep_k_best(scores, valid, g, k)
