"""OTB: the Optimal Token Baseline with the Logit-Gradient Proxy (arXiv:2602.07078)."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, check_rewards

_VERL = "volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7"
_OFFICIAL = f"{_VERL}:verl/trainer/ppo/core_algos.py"
_EPS = 1e-8  # verl's `epsilon` default in the baseline's denominator (not exposed in verl's config either)


def _validate(config) -> None:
    if not isinstance(config.otb_handle_zero_tail, bool):
        raise ValueError(  # noqa: TRY004  (config values raise ValueError, naming the flag)
            f"otb_handle_zero_tail must be True or False, got {config.otb_handle_zero_tail!r}."
        )
    if config.scale_rewards != "group":
        raise ValueError(
            f"token_weighting='otb' computes its own advantages A = G − B (no std scaling), so "
            f"scale_rewards={config.scale_rewards!r} would be ignored; leave scale_rewards at its default."
        )


def logit_gradient_proxy(logps: torch.Tensor, sum_pi_squared: torch.Tensor) -> torch.Tensor:
    """`‖e_y − π‖² = 1 − 2π_y + Σ_v π_v²`: the squared norm of `∂ log π_y / ∂ logits`, from forward quantities only.
    Clamped at 0 (it is a squared norm; float rounding can leave it at −1e-8 when π_y ≈ 1)."""
    return (1.0 - 2.0 * logps.exp() + sum_pi_squared).clamp(min=0.0)


@register(
    "otb",
    name="OTB (Optimal Token Baseline) + Logit-Gradient Proxy",
    paper="The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL, arXiv:2602.07078",
    official_code=f"{_OFFICIAL}:compute_optimal_token_baseline_advantage",
    stage="token_weights",
    flags={"token_weighting": "otb", "loss_type": "dapo", "beta": 0.0},
    requires=("sum_pi_squared", "old_logps", "group_structure"),
    replaces=("advantages",),
    params=("otb_handle_zero_tail",),
    validate=_validate,
)
def otb_token_advantages(
    advantages: torch.Tensor, ctx: TokenContext, *, otb_handle_zero_tail: bool = False
) -> torch.Tensor:
    r"""OTB: per-token advantages `A_{i,t} = (G_{i,t} − B_t) · m_{i,t}` with the group's optimal token baseline.

    For rollout `i` of a group and completion position `t` (`m` the completion mask, `π_{i,t}` the rollout
    policy's probability of the sampled token, `Σπ²_{i,t} = Σ_v π_v²` of its next-token distribution, both at the
    sampling temperature):

        w_{i,t} = 1 − 2π_{i,t} + Σπ²_{i,t}                  (Logit-Gradient Proxy: ‖e_y − π‖² = ‖∂log π_y/∂z‖²)
        W_{i,t} = Σ_{j≤t} w_{i,j} m_{i,j}                   (cumulative "realized energy" of the path)
        B_t     = Σ_i G_{i,t} W_{i,t} m_{i,t} / (Σ_i W_{i,t} m_{i,t} + 1e-8)   (over the group's members at t)
        A_{i,t} = (G_{i,t} − B_t) · m_{i,t}

    `G_{i,t}` is the reward-to-go; with TRL's outcome rewards (one reward per completion, on its last token) it is
    the reward `R_i` at every real token. Writing `S = Σ_{j≠i} W_{j,t}` and `B_{−i}` the others' W-weighted mean,
    `A_{i,t} = S (R_i − B_{−i}) / (W_{i,t} + S)`: a rollout's update shrinks as its own cumulative gradient-norm
    proxy grows — the paper's "updates weighted inversely to their cumulative gradient norm".

    Shapes: `advantages` `(N,)` (unused: OTB replaces the advantage stage, `replaces=("advantages",)`),
    `ctx.rewards` `(N,)`, `ctx.logps`, `ctx.sum_pi_squared`, `ctx.completion_mask` `(N, T)`. Returns `(N, T)`
    float32, 0 on padding.

    Citation: Li et al., arXiv:2602.07078. Official code (the authors' verl integration):
    volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7:verl/trainer/ppo/core_algos.py,
    `compute_optimal_token_baseline_advantage` (l.758–873: returns l.810, w l.813–814, W l.823, `N == 1` l.836,
    baseline l.850–853, `handle_zero_tail` l.858–868, A l.871), Σπ² from
    verl/utils/torch_functional.py `calculate_sum_pi_squared_from_logits` (l.680–694) on the temperature-divided
    logits (verl/workers/actor/dp_actor.py l.259 and l.281–287, l.368 and l.377–382); docs/algo/otb.md of the
    same commit gives the same formulas.
    The paper's method section could not be read here (only its abstract); the formulas are the official code's.

    Choices, and why:
    - Σπ² and π come from the trainer's no-grad forward of the rollout policy (`requires=("sum_pi_squared",)`,
      `trl_groupx/token_weights/sum_pi_squared.py`), as verl's `compute_log_prob` of the actor.
    - verl's rollout-IS rescaling of `w` by `ρ̄²` (only with its rollout importance sampling) is not applied: TRL's
      vLLM IS correction acts in the loss, and the TokenContext carries no IS weights.
    - `otb_handle_zero_tail` (verl's `handle_zero_tail`, default False there and here): when one member of a group
      is strictly the longest, its baseline is 0 beyond the second-longest length (else there `B_t ≈ G_i` and its
      tail gets ≈ 0 advantage).
    - NaN rewards (unscored or filtered rollouts): the row is left out of every baseline sum and gets 0; lengths for
      `otb_handle_zero_tail` count scored rows only. A group whose configured size `G` is 1 gets no baseline
      (`A = R`), as verl's `N == 1` branch; a larger group reduced by NaN rewards to one scored member still uses
      the formula (its `B_t ≈ R`, so `A ≈ 0`, as GRPO's mean-centring gives 0).
    - `w` is clamped at 0 (float rounding only; it is a squared norm). ±inf rewards raise.
    """
    if ctx.rewards is None or ctx.logps is None or ctx.sum_pi_squared is None:
        raise ValueError(
            "token_weighting='otb' needs rewards, rollout log-probs and sum_pi_squared (Σπ² per token) in the "
            "TokenContext; the trainer fills them when the variant requires 'sum_pi_squared'."
        )
    check_rewards("otb", ctx.rewards)
    n, group_size = ctx.completion_mask.shape[0], ctx.group_size
    check_groups(n, group_size)
    rewards = ctx.rewards.detach().float().to(ctx.completion_mask.device)
    scored = ~torch.isnan(rewards)
    valid = ctx.completion_mask.bool() & scored[:, None]  # (N, T)
    vf = valid.float()
    # outcome reward → reward-to-go equals R at every real token
    returns = torch.nan_to_num(rewards, nan=0.0)[:, None] * vf
    proxy = logit_gradient_proxy(ctx.logps.detach().float(), ctx.sum_pi_squared.detach().float())
    proxy = torch.where(valid, proxy, torch.zeros_like(proxy))  # padding never read (may hold junk or NaN)
    w_cum = proxy.cumsum(dim=-1)
    if group_size == 1:
        return returns  # verl: a single trajectory gets no baseline
    numerator = grouped(returns * w_cum * vf, group_size).sum(1)  # (N/G, T)
    denominator = grouped(w_cum * vf, group_size).sum(1) + _EPS
    baseline = (numerator / denominator).repeat_interleave(group_size, dim=0)  # (N, T)
    if otb_handle_zero_tail:
        lengths = grouped(valid.sum(-1), group_size)  # (N/G, G)
        top2 = lengths.topk(2, dim=1).values
        longest, second = top2[:, 0], top2[:, 1]
        is_longest = lengths == longest[:, None]
        unique = (is_longest.sum(1) == 1) & (longest > second)
        row = (is_longest & unique[:, None]).reshape(-1)  # (N,)
        positions = torch.arange(valid.shape[1], device=valid.device)
        tail = row[:, None] & (positions[None, :] >= second.repeat_interleave(group_size)[:, None])
        baseline = torch.where(tail, torch.zeros_like(baseline), baseline)
    return (returns - baseline) * vf
