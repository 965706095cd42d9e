"""GTPO (Group-relative Trajectory-based Policy Optimization): conflict-token protection + entropy filter."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, clean_advantages

_OFFICIAL = "winstonsmith1897/GTPO@5d33811e8ea1cf76c665db65b247cef9d1e436dd:gtpo/gtpo_training.py"


def _validate(config) -> None:
    if not config.gtpo_conflict_weight >= 0:
        raise ValueError(f"gtpo_conflict_weight must be >= 0, got {config.gtpo_conflict_weight!r}.")
    if not config.gtpo_conflict_entropy_max > 0:
        raise ValueError(
            f"gtpo_conflict_entropy_max must be > 0 (mean entropy in nats; use float('inf') to keep every "
            f"completion), got {config.gtpo_conflict_entropy_max!r}."
        )
    if not config.gtpo_conflict_entropy_coef >= 0:
        raise ValueError(f"gtpo_conflict_entropy_coef must be >= 0, got {config.gtpo_conflict_entropy_coef!r}.")


def _shared_run(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, g: int) -> torch.Tensor:
    """`(N, T)` bool: leading run (from t = 0) of positions whose token also occurs at that position in a
    positive AND in a negative completion of the same group; only for active (pos or neg) rows."""
    n, t = ids.shape
    ids_g, m_g = grouped(ids, g), grouped(mask, g)  # (B, G, T)
    same = (ids_g[:, :, None, :] == ids_g[:, None, :, :]) & m_g[:, :, None, :] & m_g[:, None, :, :]  # (B,G,G,T)
    pos_g, neg_g = grouped(pos, g), grouped(neg, g)  # (B, G)
    has_pos = (same & pos_g[:, None, :, None]).any(2)
    has_neg = (same & neg_g[:, None, :, None]).any(2)
    raw = (has_pos & has_neg).reshape(n, t) & (pos | neg)[:, None]
    return torch.cumprod(raw.to(torch.int), dim=1).bool()


def conflict_mask(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, g: int) -> torch.Tensor:
    """`(N, T)` bool conflict tokens: the shared-prefix run OR the shared-suffix run (suffix = right-aligned)."""
    t = ids.shape[1]
    lengths = mask.sum(-1, keepdim=True)  # (N, 1)
    s = torch.arange(t, device=ids.device)[None, :]  # position from the end
    src = (lengths - 1 - s).clamp(min=0)  # (N, T) left-aligned index of the s-th token from the end
    ids_r = ids.gather(1, src)
    mask_r = s < lengths
    fwd = _shared_run(ids, mask, pos, neg, g)
    rev_r = _shared_run(ids_r, mask_r, pos, neg, g)
    rev = rev_r.gather(1, (lengths - 1 - s).clamp(min=0)) & mask  # back to left-aligned positions
    return (fwd | rev) & mask


@register(
    "gtpo_conflict",
    name="GTPO (conflict-token protection, entropy filter)",
    paper="GTPO: Trajectory-Based Policy Optimization in Large Language Models, arXiv:2508.03772",
    official_code=_OFFICIAL,
    stage="token_weights",
    flags={"token_weighting": "gtpo_conflict", "gtpo_conflict_weight": 2.0, "gtpo_conflict_entropy_max": 0.7,
           "gtpo_conflict_entropy_coef": 0.1, "gtpo_conflict_normalize": True, "loss_type": "grpo",
           "scale_rewards": "none", "beta": 0.0},
    requires=("entropies",),
    params=("gtpo_conflict_weight", "gtpo_conflict_entropy_max", "gtpo_conflict_entropy_coef",
            "gtpo_conflict_normalize"),
    validate=_validate,
)
def gtpo_conflict_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    gtpo_conflict_weight: float,
    gtpo_conflict_entropy_max: float,
    gtpo_conflict_entropy_coef: float,
    gtpo_conflict_normalize: bool,
) -> torch.Tensor:
    r"""GTPO: protect conflict tokens, filter high-entropy completions, shape the advantage by entropy.

    Per group, `O+ = {i: A_i > 0}` and `O- = {i: A_i < 0}` (incoming advantages; the official A = r − mean, so
    the flags set `scale_rewards="none"`). A position `t` of an active completion is *conflicting* when its token
    also appears at position `t` in some completion of `O+` and in some completion of `O-`; the conflict tokens
    are the leading run of such positions from the start (shared prefix) and, with completions right-aligned,
    the leading run from the end (shared suffix); `C_i` is their set (prefix ∪ suffix), `n_i = max(|C_i|, 1)`.
    Token weights: `δ_{i,t} = W` (`gtpo_conflict_weight`, 2) for `i ∈ O+`, `t ∈ C_i`; 0 for `i ∈ O-`, `t ∈ C_i`
    (no negative update on a token a correct answer also uses); 1 otherwise. With `H̄_i` the mean rollout
    entropy over completion `i`'s tokens:

        A'_{i,t} = 1[H̄_i ≤ H_max] · (A_i − c·H̄_i) · δ_{i,t} / n_i       (÷ n_i only if gtpo_conflict_normalize)

    (`H_max` = `gtpo_conflict_entropy_max` 0.7, `c` = `gtpo_conflict_entropy_coef` 0.1), 0 on padding. With the
    official sequence-mean loss (`loss_type="grpo"`, ratio 1, no KL) this reproduces its per-completion loss
    `Σ_t −A·δ/L_i / n_i`.

    Shapes: `advantages` `(N,)`, `ctx.completion_ids`/`ctx.entropies`/`ctx.completion_mask` `(N, T)`; returns
    `(N, T)`.

    Official code: `winstonsmith1897/GTPO@5d33811e8ea1cf76c665db65b247cef9d1e436dd`, `gtpo/gtpo_training.py`:
    constants l.54-56 (ENT_THRESHOLD 0.7, ENT_SCALE 0.1, W_RAW 2), `build_conflict_mask` l.115-239 (bincount of
    (position, token) keys per sign, `cumprod` runs forward and on the right-aligned reversal), `gtpo_compute_loss`
    l.245-272 (`loss / n_conflict` l.270), `UnslothEfficientGTPO.forward` l.279-416 (entropy filter l.334 and
    `adv − ENT_SCALE·entropy` l.366-371). Where it differs, and what we do:
    - miscount: `n_conflict` ORs the forward mask with the suffix mask still in the *reversed, shifted* frame
      (l.227), so suffix conflicts are counted at wrong positions; we count `|prefix ∪ suffix|` in one frame
      (paper wins, per official-code.md);
    - the official weight is the product of the prefix and suffix weights, so a positive token in both runs gets
      W² = 4; we weight every conflict token of a positive completion by W once (the paper's "amplify positive
      updates" on a set of conflict tokens; our choice);
    - entropy: the official uses the current policy's mean entropy at loss time; ours is the rollout policy's
      (equal in value for the single on-policy update the official loop performs);
    - padding is recognised by the completion mask, not by the Llama-3 pad id 128004.
    Edge cases: unscored rollouts (NaN reward) get 0 and are neither positive nor negative; a completion with
    A = 0 (e.g. an all-equal group) takes no part in conflicts but, as in the official code, still gets the
    entropy term `−c·H̄_i` if kept; G = 1 has no conflicts; empty completions get 0.
    """
    if ctx.entropies is None or ctx.completion_ids is None:
        raise ValueError("token_weighting='gtpo_conflict' needs rollout entropies and completion ids.")
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("gtpo_conflict", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    scored = torch.ones_like(adv, dtype=torch.bool)
    if ctx.rewards is not None:
        scored = ~torch.isnan(ctx.rewards.to(adv.device))
    pos, neg = scored & (adv > 0), scored & (adv < 0)
    conflict = conflict_mask(ctx.completion_ids, mask, pos, neg, ctx.group_size)
    delta = torch.where(conflict & pos[:, None], torch.full_like(adv[:, None].expand(mask.shape), gtpo_conflict_weight),
                        torch.ones(mask.shape, dtype=adv.dtype, device=adv.device))
    delta = torch.where(conflict & neg[:, None], torch.zeros_like(delta), delta)
    lengths = mask.sum(-1)
    ent = torch.where(mask, ctx.entropies.detach().float(), torch.zeros_like(delta))
    mean_h = ent.sum(-1) / lengths.clamp(min=1)
    kept = scored & (mean_h <= gtpo_conflict_entropy_max)
    shaped = torch.where(kept, adv - gtpo_conflict_entropy_coef * mean_h, torch.zeros_like(adv))
    if gtpo_conflict_normalize:
        shaped = shaped / conflict.sum(-1).clamp(min=1).to(shaped.dtype)
    out = shaped[:, None] * delta
    return torch.where(mask, out, torch.zeros_like(out))
