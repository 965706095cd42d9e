"""TW-GRPO: token weights from the intra-group divergence of the next-token distributions (arXiv:2505.24718)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, clean_advantages

_OFFICIAL = "longmalongma/TW-GRPO@aa529ffca7ae408e4f3df7ba71cb0dc58544c6b7:src/open_r1/trainer/grpo_trainer.py"
_CLAMP = 11.0  # official clamp of the log-ratio before the k3 term (l.667)
_EPS = 1e-8  # official min-max denominator guard (l.674)


def _validate(config) -> None:
    alpha = config.tw_grpo_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 1.0:
        raise ValueError(
            f"tw_grpo_alpha must be a finite number >= 1 (the largest token weight; weights lie in [1, alpha], "
            f"1 gives plain GRPO), got {alpha!r}; the paper's runs use 1.7."
        )


def group_token_divergence(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""`(T,)` official intra-group divergence of one group's full next-token log-probs `logps` `(G, T, V)`.

    With `l_{i,t,v}` the log-probs (replaced by the uniform `−log V` wherever `mask` `(G, T)` is 0, so padding
    is never read), `m_{t,v} = (1/G) Σ_j l_{j,t,v}` (mean in log space) and `δ_{i,t,v} = clamp(m_{t,v} − l_{i,t,v},
    −11, 11)`:

        D_t = (1/G) Σ_i Σ_v [exp(δ_{i,t,v}) − δ_{i,t,v} − 1]

    (the k3 estimator's integrand summed over the vocabulary, without weighting by a probability).
    """
    if logps.dim() != 3 or mask.shape != logps.shape[:2]:
        raise ValueError(f"expected logps (G, T, V) and mask (G, T), got {tuple(logps.shape)}, {tuple(mask.shape)}.")
    logps = logps.float()
    uniform = logps.new_tensor(-math.log(logps.shape[-1]))  # broadcast: no (G, T, V) tensor of it
    filled = torch.where(mask.bool()[..., None], logps, uniform)
    delta = (filled.mean(dim=0, keepdim=True) - filled).clamp(-_CLAMP, _CLAMP)
    return (delta.exp() - delta - 1.0).sum(dim=-1).mean(dim=0)


def tw_grpo_token_weights(
    divergence: torch.Tensor, completion_mask: torch.Tensor, group_size: int, alpha: float
) -> torch.Tensor:
    """`(N, T)` weights `w = 1 + (α − 1)(D − min D)/(max D − min D + 1e-8)`, min and max over the positions of each
    group where at least one member has a real token; 1 elsewhere. `divergence` `(N, T)` holds each group's `D_t`
    on every row of the group (the trainer's `intra_group_token_divergence`); only those positions are read."""
    check_groups(completion_mask.shape[0], group_size)
    real = grouped(completion_mask.bool(), group_size).any(dim=1)  # (N/G, T)
    d = grouped(divergence.detach().float(), group_size)[:, 0]  # the group's D_t (same on every row)
    d = torch.where(real, d, torch.zeros_like(d))  # positions past the group's longest completion: never read
    d_min = torch.where(real, d, torch.full_like(d, math.inf)).amin(dim=1, keepdim=True)
    d_max = torch.where(real, d, torch.full_like(d, -math.inf)).amax(dim=1, keepdim=True)
    has_real = real.any(dim=1, keepdim=True)
    d_min = torch.where(has_real, d_min, torch.zeros_like(d_min))
    d_max = torch.where(has_real, d_max, torch.zeros_like(d_max))
    weights = 1.0 + (alpha - 1.0) * (d - d_min) / (d_max - d_min + _EPS)
    weights = torch.where(real, weights, torch.ones_like(weights))
    return weights.repeat_interleave(group_size, dim=0)


@torch.no_grad()
def intra_group_token_divergence(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    group_size: int,
    *,
    temperature: float,
    groups: Iterable[int] | None = None,
    min_forwards: int = 0,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    position_chunk: int = 256,
    **model_inputs: Any,
) -> torch.Tensor:
    """`(N, T)` float32: `D_t` of each group (`group_token_divergence`) on every row of the group, at the positions
    before the group's longest completion; 0 after it and for groups not in `groups` (default: all). With
    `min_forwards`, discarded forwards of group 0 follow until that many ran: sharded models (ZeRO-3, FSDP) need the
    same number of forwards on every process.

    One no-grad forward per group (its `G` rows, completions cut at the group's longest one), the logits divided by
    `temperature`, log-softmax in float32 over chunks of `position_chunk` positions: the peak is one group's
    `(G, T, V)` logits in the model's dtype plus `(G, position_chunk, V)` float32 temporaries, never the batch's."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    unsupported = sorted(k for k, v in model_inputs.items() if v is not None)
    if unsupported:
        raise ValueError(f"token_weighting='tw_grpo' computes its divergence for text models only; the batch carries "
                         f"extra model inputs {unsupported}.")
    n, t_len = completion_ids.shape
    check_groups(n, group_size)
    out = torch.zeros(n, t_len, dtype=torch.float32, device=completion_ids.device)
    todo = list(range(n // group_size) if groups is None else groups)
    todo += [None] * (min_forwards - len(todo))
    for g in todo:
        keep = g is not None
        rows = slice(g * group_size, (g + 1) * group_size) if keep else slice(0, group_size)
        mask = completion_mask[rows]
        # an all-empty group still runs one position (D = 0 there: every member is uniform)
        length = int(mask.bool().any(dim=0).nonzero().max().item()) + 1 if mask.any() else 1
        # left padding that the whole group shares is dropped: the group's forward does not depend on the other
        # groups of the batch, nor on how many processes gathered it
        first = int(prompt_mask[rows].bool().any(dim=0).nonzero().min().item()) if prompt_mask[rows].any() else 0
        ids = torch.cat([prompt_ids[rows, first:], completion_ids[rows, :length]], dim=1)
        attention = torch.cat([prompt_mask[rows, first:], mask[:, :length]], dim=1)
        inputs = {"input_ids": ids, "attention_mask": attention}
        with autocast():
            logits = model(**inputs, logits_to_keep=length + 1, use_cache=False).logits
        # position j predicts token j+1: the completion tokens' logits are the last `length + 1` positions but the last
        logits = logits[:, -(length + 1): -1]
        for start in range(0, length, position_chunk):
            end = min(start + position_chunk, length)
            logps = torch.log_softmax(logits[:, start:end].float() / temperature, dim=-1)
            if keep:
                out[rows, start:end] = group_token_divergence(logps, mask[:, start:end])[None, :]
        del logits
    return out


@register(
    "tw_grpo",
    name="TW-GRPO (token weights from intra-group divergence)",
    paper="Reinforcing Video Reasoning with Focused Thinking, arXiv:2505.24718",
    official_code=f"{_OFFICIAL}:compute_token_importance_kl_logs_uniform",
    stage="token_weights",
    flags={"token_weighting": "tw_grpo", "tw_grpo_alpha": 1.7, "loss_type": "dapo", "epsilon": 0.2,
           "epsilon_high": 0.28, "beta": 0.0},
    requires=("intra_group_token_divergence",),
    params=("tw_grpo_alpha",),
    validate=_validate,
)
def tw_grpo_token_advantages(advantages: torch.Tensor, ctx: TokenContext, *, tw_grpo_alpha: float = 1.7) -> torch.Tensor:
    r"""TW-GRPO: `A_{i,t} = w_{g,t} · A_i`, one weight per group and position, larger where the group's next-token
    distributions disagree.

    For group `g` (rows `i = 1..G`) and completion position `t`, with `l_{i,t,·}` the full next-token log-probs of
    row `i` under the policy (uniform `−log V` where row `i` is padding), `m_{t,·} = (1/G) Σ_i l_{i,t,·}`:

        D_{g,t} = (1/G) Σ_i Σ_v k3(m_{t,v} − l_{i,t,v}),   k3(δ) = e^δ − δ − 1,  δ clamped to [−11, 11]
        w_{g,t} = 1 + (α − 1) · (D_{g,t} − min_s D_{g,s}) / (max_s D_{g,s} − min_s D_{g,s} + 1e-8)   ∈ [1, α]

    `min_s`, `max_s` over the group's positions before its longest completion. Positions where the group agrees
    (generic prefixes, identical tokens) get weight 1, the most divergent position α. With weights `w > 0` the
    official clipped loss `−w · min(ρA, clip(ρ)A)` equals the clipped loss of the advantage `wA`, so the stage
    returns `w_{g,t} A_i` and every loss type applies it (paper: token-mean, `loss_type="dapo"`).

    Shapes: `advantages` `(N,)`; `ctx.intra_group_token_divergence` `(N, T)` (`D_{g,t}` on every row of group `g`,
    filled by the trainer from a no-grad forward, `intra_group_token_divergence`); `ctx.completion_mask` `(N, T)`.
    Returns `(N, T)` float32, 0 on padding (the official weights are multiplied by the completion mask too).

    Citation: Dang et al., "Reinforcing Video Reasoning with Focused Thinking", arXiv:2505.24718. Official code
    longmalongma/TW-GRPO@aa529ffca7ae408e4f3df7ba71cb0dc58544c6b7:src/open_r1/trainer/grpo_trainer.py:
    `compute_token_importance_kl_logs_uniform` (l.640–690: uniform fill l.657–660, log-space group
    mean l.663, clamped k3 summed over V and averaged over G l.666–669, min-max over positions l.672–674, map to
    `[1, max_weight]` l.677, repeated per member l.679), applied in `compute_loss` (l.572–609: clipped surrogate
    l.587–592 times the weights, token-mean l.605–609); `get_per_token_logps` (l.462–474) gives the full-vocabulary
    log-softmax of the raw logits; `scripts/tw-grpo.sh`: `--alpha 1.70`, `--beta 0.00`, 8 generations.

    Choices, and why:
    - Detached weights, computed once per generation batch. The official code computes them inside the loss from
      the current logits, so they carry gradient: its loss adds `Σ_t (∂w_{g,t}/∂θ) · (surrogate)_t`, a term that
      moves the policy to change how much its group's distributions disagree (sign set by the advantages). Ours
      only reweights the policy gradient, `Σ_t w_{g,t} ∇(surrogate)_t`, as the paper describes the method. Doing it
      the official way would keep a `(G, T, V)` log-softmax per group in the autograd graph of every micro-batch
      (and split groups across micro-batches, which TRL shuffles), while the token-weight stage runs once on the
      whole generation batch with groups intact.
    - The distributions are the rollout policy's (the trainer's model at generation time), divided by TRL's
      `temperature` like every other per-token statistic here; the official code uses the raw logits (equal at
      temperature 1, its default `generate_temperature`).
    - The min-max runs over the positions before the group's longest completion. The official code runs it over the
      padded length of the device batch, which in its scripts (`per_device_train_batch_size 1`: one prompt and its
      `G` completions per device) is that group's longest completion too; with several groups in one device batch
      its shorter groups would also see all-padding positions with `D = 0`, which ours does not read.
    - Rows whose completion mask the sampling or advantage stage zeroed (dropped rollouts) enter the divergence as
      uniform distributions, as padding does; their own advantage is 0. NaN rewards get advantage 0; ±inf raise.
    - Each group's forward drops the left padding its members share (all members have the same prompt), so `D` does
      not depend on the other groups of the batch or the number of processes, as in the official one-group batches.
      Groups are split over processes (a group may straddle two) and the results summed; text models only.
    - `G = 1`: `D = 0` everywhere, so every weight is 1 (plain GRPO), as the official formula gives.
    """
    if ctx.intra_group_token_divergence is None:
        raise ValueError("token_weighting='tw_grpo' needs TokenContext.intra_group_token_divergence; the trainer "
                         "fills it when the variant requires 'intra_group_token_divergence'.")
    adv = clean_advantages("tw_grpo", advantages, ctx.rewards).to(ctx.completion_mask.device)
    weights = tw_grpo_token_weights(ctx.intra_group_token_divergence, ctx.completion_mask, ctx.group_size,
                                    tw_grpo_alpha)
    return adv[:, None] * weights * ctx.completion_mask.to(weights.dtype)
