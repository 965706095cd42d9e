"""S-GRPO and T-SPMO (Token-Efficient RL for LLM Reasoning): prefix-trie token credit and stochastic token subsets."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, clean_advantages, reject_sequence_averaging_objective
from .nat import nat_generator, sample_keep

CREDIT_MODES = ("prefix", "sequence")
# Upper bound on the elements of one chunk's (groups, G, G, T) prefix-match tensor: bounds the memory of the trie
# walk for large groups or long completions.
_MAX_CHUNK_ELEMENTS = 1 << 25


def _validate(config) -> None:
    if config.s_grpo_tspmo_credit not in CREDIT_MODES:
        raise ValueError(
            f"s_grpo_tspmo_credit must be one of {CREDIT_MODES} ('prefix' = T-SPMO, 'sequence' = S-GRPO), "
            f"got {config.s_grpo_tspmo_credit!r}."
        )
    if not 0.0 < config.s_grpo_tspmo_keep_prob <= 1.0:
        raise ValueError(
            "s_grpo_tspmo_keep_prob must lie in (0, 1] (1 = every token enters the loss), "
            f"got {config.s_grpo_tspmo_keep_prob!r}."
        )
    reject_sequence_averaging_objective("s_grpo_tspmo", config)


def shared_prefix(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(B, G, G, T)` bool: `[b, i, j, t]` is True iff completions `i` and `j` of group `b` both have real tokens at
    positions `0..t` and these tokens are equal (the trie node reached by `i` after its token `t` is also on `j`'s
    path). Token ids are compared only where both masks are 1, so padding is never read."""
    both = mask[:, :, None, :] & mask[:, None, :, :]
    match = both & (ids[:, :, None, :] == ids[:, None, :, :])
    return (~match).cumsum(-1, dtype=torch.int32) == 0


def prefix_credit(values: torch.Tensor, valid: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(B, G, T)` float64 T-SPMO credit for groups laid out `(B, G, ...)`.

    `V(node)` = mean of `values` over the valid completions whose path passes through the node; the credit of
    completion `i`'s token `t` is `V(node after t) − V(node before t)`, the root (empty prefix) being the mean over
    every valid completion of the group. 0 on padding and on invalid completions.
    """
    b, g, t = ids.shape
    w = valid.double()  # (B, G)
    wv = w * torch.where(valid, values.double(), torch.zeros_like(values, dtype=torch.float64))
    through = shared_prefix(ids, mask).double()  # (B, G, G, T)
    count = torch.einsum("bijt,bj->bit", through, w)
    total = torch.einsum("bijt,bj->bit", through, wv)
    v_through = total / count.clamp(min=1.0)
    root = (wv.sum(-1) / w.sum(-1).clamp(min=1.0))[:, None, None].expand(b, g, 1)
    v_before = torch.cat([root, v_through[..., :-1]], dim=-1)
    credit = v_through - v_before
    return torch.where(mask & valid[..., None], credit, torch.zeros_like(credit))


@register(
    "s_grpo_tspmo",
    name="S-GRPO and T-SPMO (stochastic token subsets; token-level prefix-matching credit)",
    paper="Token-Efficient RL for LLM Reasoning, arXiv:2504.20834",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "s_grpo_tspmo", "s_grpo_tspmo_credit": "prefix", "s_grpo_tspmo_keep_prob": 1.0},
    requires=("global_step",),
    params=("s_grpo_tspmo_credit", "s_grpo_tspmo_keep_prob"),
    validate=_validate,
)
def s_grpo_tspmo_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    s_grpo_tspmo_credit: str,
    s_grpo_tspmo_keep_prob: float,
    seed: int = 0,
    global_step: int = 0,
    total_steps: int = 0,
) -> torch.Tensor:
    r"""T-SPMO prefix-trie credit (`s_grpo_tspmo_credit="prefix"`) or S-GRPO's sequence advantage
    (`"sequence"`), on a random subset of tokens when `s_grpo_tspmo_keep_prob < 1`.

    T-SPMO credit. The `G` completions of a group form a prefix trie over their token ids. With `v_i` the incoming
    (sequence) advantage of completion `i` and `S(i, t) = {j valid : y_j[0..t] = y_i[0..t]}` the completions that
    pass through the node `i` reaches after its token `t` (`i` included),

        V(i, t)  = mean_{j ∈ S(i, t)} v_j,        V(i, −1) = mean_{j valid in the group} v_j     (the root)
        A'_{i,t} = V(i, t) − V(i, t − 1)

    so a token of a shared prefix (every completion that shares the prefix before it also continues with it) gets 0,
    the token where completions diverge gets the difference between its branch's mean and its parent's mean, and a
    token after the branch has become `i`'s alone gets 0 again. Along a completion the credits telescope:
    `Σ_t A'_{i,t} = V(i, L_i − 1) − V(root)`, i.e. `v_i − mean_group(v)` for a completion no other one duplicates
    (= `v_i` under GRPO's zero-mean advantages): the sequence credit is redistributed onto branching tokens.
    Catalog check: 'a b c' (r = 1), 'a b d' (r = 0), `scale_rewards="none"` (v = ±0.5): a, b get 0, c gets
    1 − 0.5 = +0.5 and d gets −0.5.

    S-GRPO token subset. With `q = s_grpo_tspmo_keep_prob < 1`, each real token independently enters the loss with
    probability `q` and a kept token's advantage is divided by `q` (NAT's URS draw and Horvitz–Thompson weight,
    `trl_groupx/token_weights/nat.py`, with the same generator seeded from `seed` and `global_step`), so the
    expected gradient is the full-token one. `"sequence"` with `q < 1` is S-GRPO; `"prefix"` with `q = 1` is T-SPMO
    (the registered default); `"sequence"` with `q = 1` returns GRPO's broadcast advantages exactly.

    Shapes: `advantages` `(N,)`, `ctx.completion_ids`/`ctx.completion_mask` `(N, T)`, `ctx.rewards` `(N,)`;
    returns `(N, T)`. Vectorised over groups: the trie walk is a cumulative equality mask `(groups, G, G, T)`,
    computed in chunks of groups to bound memory.

    Citation: Lee & Tong, "Token-Efficient RL for LLM Reasoning", arXiv:2504.20834 (v1 title: "Reinforcement
    Learning for LLM Reasoning Under Memory Constraints"); no public code. Only the abstract could be retrieved
    (arxiv.org/html/2504.20834v1 and v3, first section); the method section (the paper's T-SPMO advantage formula
    and S-GRPO's token-selection rule) was not retrievable here. The formula above is therefore not claimed to be
    the paper's: it is our reading of the abstract's "token-level prefix matching approach for fine-grained credit
    assignment" that satisfies the catalog's check (`../shared/catalog.md`, row `s_grpo_tspmo`: shared-prefix
    tokens 0, divergent tokens ±) with credit local to the branch points.
    Choices (ours, where the retrievable sources are silent):
    - Choice: the value averaged in the trie is the incoming sequence advantage `v_i`, not the raw reward. Under
      `scale_rewards="none"` the group-mean shift cancels in the difference, so the credit equals the difference of
      mean rewards; under `"group"` it is that difference over the group's std; any advantage-stage variant
      composes.
    - Choice: credit is the difference between the child's and the parent's mean (local credit at branch points),
      not the child's mean minus the group mean (which would repeat the credit on every later token).
    - Choice: a completion that stops earlier (EOS or a stop string) counts in the means of every node on its path
      and in no node below it; truncated completions are matched on their real tokens only. The mask is read as a
      prefix mask: a hole in it ends the shared prefix.
    - Choice: each completion's tokens carry their node's credit once per completion (nodes visited by `k`
      completions weigh `k` times in the loss, the Monte Carlo weighting); no de-duplication of (prefix, token)
      pairs.
    - Choice: S-GRPO's subset is NAT's Bernoulli(q) draw with `1/q` (Horvitz–Thompson) weights, reused from
      `nat.py`; the paper's selection rule (which tokens, how many, any weighting) is not retrievable, and this
      selection is not claimed to be it.
    - NaN rewards (or NaN incoming advantages) are excluded from every mean and their tokens get 0; ±inf rewards
      are an error; groups with one valid completion (G = 1 included) or identical completions get 0 everywhere.
    Limitation: as for NAT, the token subset reproduces the estimator but not S-GRPO's memory saving (the trainer
    still runs forward/backward over every completion token). Objectives that average token advantages over each
    completion (`loss_type="gmpo"`) would spread each completion's total credit evenly again and are rejected.
    """
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("s_grpo_tspmo", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    if s_grpo_tspmo_credit == "prefix":
        if ctx.completion_ids is None:
            raise ValueError("token_weighting='s_grpo_tspmo' with s_grpo_tspmo_credit='prefix' needs completion ids.")
        valid = ~torch.isnan(advantages.detach())
        if ctx.rewards is not None:
            valid &= ~torch.isnan(ctx.rewards.to(valid.device))
        token_adv = _chunked_prefix_credit(adv, valid, ctx.completion_ids, mask, ctx.group_size)
    elif s_grpo_tspmo_credit == "sequence":
        token_adv = torch.where(mask, adv[:, None].double(), torch.zeros(mask.shape, dtype=torch.float64,
                                                                          device=mask.device))
    else:
        raise ValueError(f"s_grpo_tspmo_credit must be one of {CREDIT_MODES}, got {s_grpo_tspmo_credit!r}.")
    if s_grpo_tspmo_keep_prob < 1.0:
        keep = sample_keep(mask, "urs", s_grpo_tspmo_keep_prob, 0.0, nat_generator(seed, global_step))
        token_adv = torch.where(keep, token_adv / s_grpo_tspmo_keep_prob, torch.zeros_like(token_adv))
    return token_adv.to(adv.dtype)


def _chunked_prefix_credit(adv: torch.Tensor, valid: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                           group_size: int) -> torch.Tensor:
    """`(N, T)` float64 prefix credit, computed for chunks of whole groups."""
    n, t = mask.shape
    if t == 0 or n == 0:
        return torch.zeros(n, t, dtype=torch.float64, device=mask.device)
    v, ok, y, m = (grouped(x, group_size) for x in (adv, valid, ids.to(mask.device), mask))
    per_group = group_size * group_size * t
    step = max(1, _MAX_CHUNK_ELEMENTS // per_group)
    parts = [prefix_credit(v[s:s + step], ok[s:s + step], y[s:s + step], m[s:s + step])
             for s in range(0, v.shape[0], step)]
    return torch.cat(parts).reshape(n, t)
