"""Input checks shared by the token-weight variants of this package (private)."""

from __future__ import annotations

import torch

from ..contracts import grouped


def check_rewards(variant_id: str, ctx_rewards: torch.Tensor | None) -> None:
    """±inf rewards have no meaningful advantage: a clear error naming the flag."""
    if ctx_rewards is not None and torch.isinf(ctx_rewards).any():
        raise ValueError(
            f"token_weighting={variant_id!r}: a reward is ±inf; reward functions must return finite numbers "
            "(or NaN/None for 'unscored', which gets advantage 0)."
        )


def clean_advantages(variant_id: str, advantages: torch.Tensor, rewards: torch.Tensor | None) -> torch.Tensor:
    """`(N,)` float advantages with unscored rollouts (NaN reward or NaN advantage) set to 0; ±inf is an error."""
    check_rewards(variant_id, rewards)
    if torch.isinf(advantages).any():
        raise ValueError(f"token_weighting={variant_id!r}: the incoming advantages contain ±inf.")
    adv = torch.nan_to_num(advantages.detach().float(), nan=0.0)
    if rewards is not None:
        adv = torch.where(torch.isnan(rewards.to(adv.device)), torch.zeros_like(adv), adv)
    return adv


def check_groups(n: int, group_size: int) -> None:
    grouped(torch.empty(n, 0), group_size)  # raises a clear error when N is not a multiple of G


def reject_sequence_averaging_objective(variant_id: str, config) -> None:
    """A per-token mask is undone by objectives that average token advantages over each completion (GMPO)."""
    if config.loss_type == "gmpo":
        raise ValueError(
            f"token_weighting={variant_id!r} masks single tokens, but loss_type='gmpo' averages token advantages over "
            "each completion before its geometric mean, so the mask would be undone; use a token-level loss_type "
            "(dapo, cispo, grpo, ...)."
        )


RENORMALIZE_MODES = ("token", "sequence", "none")
# The loss normaliser each renormalisation of a token mask is exact for.
EXACT_FOR = {"token": ("global_token_mean", "token_mean"), "sequence": ("sequence_mean",)}


def check_renormalization(config, flag: str) -> None:
    """`config.<flag>` is a known renormalisation mode and exact for the loss's normaliser; else a clear error."""
    from ..objective import resolved_aggregation

    mode = getattr(config, flag)
    if mode not in RENORMALIZE_MODES:
        raise ValueError(f"{flag} must be one of {RENORMALIZE_MODES}, got {mode!r}.")
    if mode == "none":
        return
    aggregation = resolved_aggregation(config)
    if aggregation not in EXACT_FOR[mode]:
        fix = next((m for m, aggs in EXACT_FOR.items() if aggregation in aggs), "none")
        raise ValueError(
            f"{flag}={mode!r} renormalises for a {EXACT_FOR[mode]} loss, but loss_type={config.loss_type!r} "
            f"normalises by {aggregation!r}; set {flag}={fix!r}."
        )
