"""Mu-GRPO's negative-advantage veto: drop the suffix of a negative-advantage completion from its trigger on."""

from __future__ import annotations

import math

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, clean_advantages, reject_sequence_averaging_objective

_TRIGGERS = ("low_prob", "high_entropy")


def _validate(config) -> None:
    reject_sequence_averaging_objective("mu_grpo", config)
    if config.mu_grpo_veto_trigger not in _TRIGGERS:
        raise ValueError(f"mu_grpo_veto_trigger must be one of {_TRIGGERS}, got {config.mu_grpo_veto_trigger!r}.")
    if not isinstance(config.mu_grpo_veto_inclusive, bool):
        raise ValueError(f"mu_grpo_veto_inclusive must be True or False, got {config.mu_grpo_veto_inclusive!r}.")
    thr = config.mu_grpo_veto_threshold
    if config.mu_grpo_veto_trigger == "low_prob" and not 0.0 < thr <= 1.0:
        raise ValueError(f"mu_grpo_veto_threshold is a probability for mu_grpo_veto_trigger='low_prob'; got {thr!r}, "
                         "expected a value in (0, 1].")
    if config.mu_grpo_veto_trigger == "high_entropy" and not thr >= 0.0:
        raise ValueError(f"mu_grpo_veto_threshold is an entropy (nats) for mu_grpo_veto_trigger='high_entropy'; got "
                         f"{thr!r}, expected a value >= 0.")


@register(
    "mu_grpo",
    name="Mu-GRPO negative-advantage veto",
    paper="How Off-Policy Can GRPO Be? Mu-GRPO for Efficient LLM Reinforcement Learning, arXiv:2605.17570",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "mu_grpo", "mu_grpo_veto_trigger": "low_prob", "mu_grpo_veto_threshold": 0.01,
           "mu_grpo_veto_inclusive": True},
    requires=("entropies", "old_logps"),
    params=("mu_grpo_veto_trigger", "mu_grpo_veto_threshold", "mu_grpo_veto_inclusive"),
    validate=_validate,
)
def mu_grpo_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    mu_grpo_veto_trigger: str,
    mu_grpo_veto_threshold: float,
    mu_grpo_veto_inclusive: bool,
) -> torch.Tensor:
    r"""Negative-advantage veto: `A'_{i,t} = A_i · (1 − v_{i,t})` on real tokens, 0 on padding, where for a
    completion with `A_i < 0` and first trigger position `τ_i`, `v_{i,t} = 1[t ≥ τ_i]`
    (`mu_grpo_veto_inclusive=True`, the trigger token is vetoed too) or `1[t > τ_i]`; completions with `A_i ≥ 0`
    and negative completions without a trigger are untouched.

    **The trigger criterion is NOT the paper's**: the abstract (the only text retrievable here; no public code,
    `official-code.md`) says only that the veto "removes destabilizing post-trigger suffix updates in
    negative-advantage responses". The trigger is therefore a flag, built from what this stage sees (the rollout
    policy's per-token log-probs and entropies, detached):
    - `mu_grpo_veto_trigger="low_prob"` (default): first real token with rollout probability
      `π(y_t) < mu_grpo_veto_threshold` (default 0.01) — a token the policy itself found unlikely, after which the
      rest of a wrong answer is a continuation the policy would rarely produce; pushing all of it down is the
      large-gradient update a stale batch makes risky;
    - `"high_entropy"`: first real token with entropy `H_t > mu_grpo_veto_threshold` (nats).
    A trigger defined on the *current* policy during optimisation (e.g. on the importance ratio of a stale token)
    is not expressible in this stage: it would need an objective-side mask. The vetoed tokens stay in the loss
    normaliser (they contribute 0), i.e. the veto removes updates rather than reweighting the rest. Objectives that
    average token advantages per completion first (GMPO) would undo the veto and are rejected.

    The other two parts of Mu-GRPO are plain TRL settings (see `recipes/mu_grpo.yaml`): few large
    generation–optimisation stages (`steps_per_generation`, large `generation_batch_size`) and relaxed clipping
    (wide `epsilon_high`); their values are not in the abstract either.

    Shapes: `advantages` `(N,)`, `ctx.logps`, `ctx.entropies`, `ctx.completion_mask` `(N, T)`; returns `(N, T)`.
    NaN-reward rollouts get 0; padding never triggers.
    """
    if ctx.logps is None or ctx.entropies is None:
        raise ValueError("token_weighting='mu_grpo' needs rollout log-probs and entropies in the TokenContext.")
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("mu_grpo", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    if mu_grpo_veto_trigger == "low_prob":
        hit = ctx.logps.detach().float() < math.log(mu_grpo_veto_threshold)
    else:
        hit = ctx.entropies.detach().float() > mu_grpo_veto_threshold
    trigger = hit & mask & (adv < 0)[:, None]
    seen = trigger.long().cumsum(-1)  # number of triggers at or before t
    veto = seen > 0 if mu_grpo_veto_inclusive else (seen - trigger.long()) > 0
    out = torch.where(mask & ~veto, adv[:, None].expand_as(veto), torch.zeros_like(veto, dtype=adv.dtype))
    return out
