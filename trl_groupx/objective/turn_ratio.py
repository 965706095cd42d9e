"""Turn-level importance ratio, `importance_sampling_level="turn"`: one ratio per assistant turn (action) of a
multi-turn episode, shared by the turn's tokens. This is GAGPO's action-level importance ratio (issue 8), usable by
every trl_groupx objective whose surrogate takes `importance_sampling_level` (`dual_clip`, `offpolicy_grpo`).

Turns: TRL 1.16 lays a multi-turn episode out as one completion row, the model's turns separated by environment /
tool tokens (`tool_mask == 0`). The trainer gives each completion token its turn index
(`trl_groupx.advantages.step_credit.turn_index_from_tool_mask`, the layout the step-credit advantages use), −1 on
tool tokens and padding, as the row tensor `groupx_turn_ids` that TRL shuffles and splits with the rows
(`ObjectiveContext.turn_ids`). A row without a tool mask is one turn: the turn ratio is then GSPO's sequence ratio.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..registry import get_variant, list_variants
from .aggregation import TRL_LOSS_AGGREGATION

TURN_LEVEL = "turn"


def turn_log_ratio(token_log_ratio: torch.Tensor, mask: torch.Tensor, turn_ids: torch.Tensor | None) -> torch.Tensor:
    """`(B, T)` log of the turn ratio of each token's turn:

        log ρ_{i,a} = (1 / |a|) Σ_{t ∈ a} (log π_θ(y_{i,t}) − log π_old(y_{i,t}))      a = the loss tokens of turn a
        ρ_{i,t}     = ρ_{i,a(t)}                                                      for every token t of turn a

    i.e. GSPO's length-normalised sequence ratio taken over one turn instead of the whole completion; the gradient
    reaches every token of the turn (`∂ρ_a / ∂log π_θ(y_t) = ρ_a / |a|`, no stop-gradient).

    Paper: GAGPO (Generalized Advantage Grouped Policy Optimization), arXiv:2605.13217; no official code is public.
    The abstract names "an action-level importance ratio" as part of the method; the text we could read gives no
    formula (a third-party summary, arxivlens.com's page on arXiv:2605.13217, calls it an "action-level
    sequence-wide importance ratio" in "a group-normalized PPO update"). Choices:
        * Choice: length-normalised (geometric mean of the turn's token ratios, as GSPO per sequence) rather than the
          turn's full product `Π_t ρ_t`, whose variance grows with the turn's length.
        * Choice: the turn is clipped as a whole by the objective (PPO's `clip(ρ_a, 1−ε, 1+ε_high)`), and the loss
          stays per token, so the run's `loss_aggregation` weighs a turn by its token count, as token-level GRPO.
        * A loss token with turn id −1 (a loss token outside every turn, which the trainer never produces) keeps
          its own token ratio; a token with `mask == 0` (tool result, padding, a masked rollout) is never read: it
          enters no turn's mean and gets log-ratio 0.

    Args:
        token_log_ratio (`torch.Tensor`): `(B, T)` `logp − logp_old` per token.
        mask (`torch.Tensor`): `(B, T)` loss mask.
        turn_ids (`torch.Tensor`): `(B, T)` long, each token's turn index in `[0, T)`, −1 outside the model's turns.

    Returns:
        `torch.Tensor`: `(B, T)`, the turn's log-ratio on its loss tokens, the token's own one on loss tokens outside
        every turn, 0 where `mask == 0`.
    """
    if turn_ids is None:
        raise ValueError(
            "importance_sampling_level='turn' needs each completion token's turn id (ObjectiveContext.turn_ids, the "
            "trainer's `groupx_turn_ids` row tensor); the trainer fills it when the config sets that level."
        )
    if turn_ids.shape != token_log_ratio.shape:
        raise ValueError(f"turn_ids must be {tuple(token_log_ratio.shape)} like the log-probs, got "
                         f"{tuple(turn_ids.shape)}.")
    width = token_log_ratio.shape[1]
    loss_token = mask > 0
    in_turn = loss_token & (turn_ids >= 0)
    slot = torch.where(in_turn, turn_ids.long(), torch.full_like(turn_ids, width, dtype=torch.long))  # T: unused slot
    zero = torch.zeros_like(token_log_ratio)
    summed = torch.zeros(*slot.shape[:1], width + 1, dtype=token_log_ratio.dtype, device=token_log_ratio.device)
    summed = summed.scatter_add(1, slot, torch.where(in_turn, token_log_ratio, zero))  # padding never enters a sum
    count = torch.zeros_like(summed).scatter_add(1, slot, in_turn.to(summed.dtype))
    turn_mean = (summed / count.clamp(min=1.0)).gather(1, slot)
    return torch.where(in_turn, turn_mean, torch.where(loss_token, token_log_ratio, zero))


def completion_turn_ids(output: dict[str, Any]) -> torch.Tensor:
    """`(B, T)` long turn index of each completion token of a generation batch output (−1 on tool tokens and
    padding): the maximal runs of `tool_mask == 1` inside the completion mask; one turn when there is no tool mask."""
    from ..advantages.step_credit import turn_index_from_tool_mask  # the layout the step advantages use

    completion_mask = output["completion_mask"]
    tool_mask = output.get("tool_mask")
    return turn_index_from_tool_mask(torch.ones_like(completion_mask) if tool_mask is None else tool_mask,
                                     completion_mask)


def turn_level_objectives() -> list[str]:
    """The dispatched objectives whose surrogate takes `importance_sampling_level` (and so accepts `"turn"`)."""
    return [v.id for v in list_variants("objective")
            if not v.native and "importance_sampling_level" in inspect.signature(v.fn).parameters]


def check_turn_level(config: Any) -> None:
    """Config-time check of `importance_sampling_level="turn"`: only trl_groupx objectives that take the level."""
    if config.importance_sampling_level != TURN_LEVEL:
        return
    supported = turn_level_objectives()
    if config.loss_type in TRL_LOSS_AGGREGATION:
        raise ValueError(
            f"importance_sampling_level='turn' (one ratio per assistant turn, GAGPO's action-level ratio) is computed "
            f"by trl_groupx's objectives; TRL's loss_type={config.loss_type!r} knows only 'token' and 'sequence'. Use "
            f"loss_type='dual_clip' (or another trl_groupx objective that takes the ratio level: {supported}), or set "
            "importance_sampling_level to 'token' or 'sequence'."
        )
    if config.loss_type not in supported:
        get_variant(config.loss_type)  # an unknown loss_type is reported by the selector check
        raise ValueError(
            f"loss_type={config.loss_type!r} defines its own importance ratio, so importance_sampling_level='turn' "
            f"does not apply to it; use one of {supported} (e.g. loss_type='dual_clip') or leave "
            "importance_sampling_level='token'."
        )
