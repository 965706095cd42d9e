"""HAPO's token-weight parts: Token Level Group Average normalisation and Differential Advantage Redistribution."""

from __future__ import annotations

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, check_rewards, clean_advantages

_OFFICIAL = "starriver030515/HAPO@7671dde3e268779a949954ec75ed3edda45f7e0a:verl/trainer/ppo/core_algos.py"
_STD_EPS = 1e-6  # official compute_hapo_outcome_advantage `epsilon`
_H_EPS = 1e-8  # official compute_entropy_h `eps` (log floor, variance floor, scale floors)


def _validate(config) -> None:
    if not 0.0 <= config.hapo_entropy_pivot <= 1.0:
        raise ValueError(f"hapo_entropy_pivot must lie in [0, 1] (a quantile), got {config.hapo_entropy_pivot!r}.")
    if not config.hapo_adv_beta >= 0:
        raise ValueError(f"hapo_adv_beta must be >= 0, got {config.hapo_adv_beta!r}.")
    if not config.hapo_fallback_threshold > 0:
        raise ValueError(
            f"hapo_fallback_threshold must be > 0 (use float('inf') to never fall back), "
            f"got {config.hapo_fallback_threshold!r}."
        )
    if config.hapo_dar and config.num_iterations != 1:
        raise ValueError(
            "token_weighting='hapo' with hapo_dar=True evaluates the importance ratio at rollout time (ratio = 1), "
            f"which is exact only for num_iterations=1, got num_iterations={config.num_iterations}; set "
            "num_iterations=1 or hapo_dar=False."
        )


def token_level_group_average(
    rewards: torch.Tensor, mask: torch.Tensor, group_size: int, fallback: torch.Tensor, threshold: float
) -> torch.Tensor:
    """`(N,)` Token Level Group Average advantages (see `hapo_token_advantages`), 0 for unscored/empty rows."""
    lengths = mask.sum(-1).float()
    member = ~torch.isnan(rewards) & (lengths > 0)
    w = torch.where(member, lengths, torch.zeros_like(lengths))  # token count of each member
    r = torch.where(member, rewards, torch.zeros_like(rewards))
    wg, rg = grouped(w, group_size), grouped(r, group_size)
    total = wg.sum(1, keepdim=True)
    mean = (wg * rg).sum(1, keepdim=True) / total.clamp(min=1)
    std = ((wg * (rg - mean) ** 2).sum(1, keepdim=True) / total.clamp(min=1)).sqrt()  # population, over tokens
    normed = (rg - mean) / (std + _STD_EPS)
    mg = grouped(member, group_size)
    normed = torch.where(mg, normed, torch.zeros_like(normed))
    use_fallback = (normed.abs() >= threshold).any(1, keepdim=True)
    out = torch.where(use_fallback, grouped(fallback, group_size), normed).reshape(-1)
    return torch.where(member, out, torch.zeros_like(out))


def entropy_h_hat(entropies: torch.Tensor, mask: torch.Tensor, pivot: float) -> torch.Tensor:
    """`(N, T)` normalised entropy ĥ ∈ [−1, 1] (paper sign; see the docstring), 0 on padding."""
    log_h = torch.log(entropies.clamp(min=_H_EPS))
    real = log_h[mask]
    if real.numel() == 0:
        return torch.zeros_like(log_h)
    ordered = real.sort().values
    median = ordered[int(torch.round(torch.tensor(pivot * (ordered.numel() - 1))).item())]  # "nearest"
    h = log_h - median
    std = ((h[mask] ** 2).sum() / mask.sum()).clamp(min=_H_EPS).sqrt()  # RMS around the pivot
    h = torch.where(mask, h / std, torch.zeros_like(h))
    pos_max = h.max().clamp(min=_H_EPS)  # padding is 0, so max/min over the masked h are right
    neg_abs = (-h.min()).clamp(min=_H_EPS)
    return torch.where(h > 0, h / pos_max, h / neg_abs)


@register(
    "hapo",
    name="HAPO (token-weight parts: Token Level Group Average + Differential Advantage Redistribution)",
    paper="HAPO: Heterogeneous Adaptive Policy Optimization, https://github.com/starriver030515/HAPO (arXiv id not recorded)",
    official_code=_OFFICIAL,
    stage="token_weights",
    flags={"token_weighting": "hapo", "hapo_token_group_norm": True, "hapo_dar": True, "hapo_adv_beta": 1.0,
           "hapo_entropy_pivot": 0.8, "hapo_fallback_threshold": 5.0, "loss_type": "dapo", "epsilon": 0.2,
           "epsilon_high": 0.2, "beta": 0.0,
           # HAPO's sampling part (sampling/adaptive_temperature.py), a generation flag rather than a stage variant
           "hapo_adaptive_temperature": True, "hapo_temperature_tau": 0.05},
    requires=("entropies",),
    params=("hapo_token_group_norm", "hapo_dar", "hapo_adv_beta", "hapo_entropy_pivot", "hapo_fallback_threshold"),
    validate=_validate,
)
def hapo_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    hapo_token_group_norm: bool,
    hapo_dar: bool,
    hapo_adv_beta: float,
    hapo_entropy_pivot: float,
    hapo_fallback_threshold: float,
) -> torch.Tensor:
    r"""HAPO's advantage side: Token Level Group Average (TLGA) then Differential Advantage Redistribution (DAR).

    **TLGA** (`hapo_token_group_norm`): per group, the statistics are taken over *tokens* — each scored, non-empty
    completion `i` with `L_i` real tokens counts `L_i` times:

        μ_g = Σ_i L_i r_i / Σ_i L_i,   σ_g = sqrt(Σ_i L_i (r_i − μ_g)² / Σ_i L_i),   A_i = (r_i − μ_g)/(σ_g + 1e-6)

    and, as in the official code, a group where some |A_i| ≥ `hapo_fallback_threshold` (5) falls back to the
    incoming sequence advantage (the advantage stage's output, GRPO by default). Off: the incoming advantage.
    (So an advantage-stage variant still matters, as the fallback, and fully with TLGA off; it is not rejected.)

    **DAR** (`hapo_dar`): with the rollout policy's entropy `H_{i,t}`, `ℓ = log max(H, 1e-8)`, the pivot
    `m = Quantile_p(ℓ)` over all real tokens of the batch (`hapo_entropy_pivot` p = 0.8, "nearest"), the spread
    `s = sqrt(max(mean (ℓ − m)², 1e-8))` and `h = (ℓ − m)/s`:

        ĥ = h / max(h⁺)  if h > 0,     ĥ = h / |min(h⁻)|  if h ≤ 0       (so ĥ ∈ [−1, 1])

    then, in the importance-ratio neutral zone `1 − ε_low/2 < r < 1 + ε_high/2`, high-entropy tokens (ĥ > 0) keep
    `A` and low-entropy tokens get `A·(1 + β·ĥ)` (β = `hapo_adv_beta`, so their update is damped towards 0);
    outside the zone it is the other way round. This stage runs once per generation batch, where the ratio is
    exactly 1 (inside the zone for any positive clip range), so

        A'_{i,t} = A_i · (1 + β ĥ_{i,t})  if ĥ_{i,t} ≤ 0,    A'_{i,t} = A_i  otherwise,

    exact when each rollout batch is used for one update (`num_iterations=1`, TRL's on-policy default; validate
    rejects other values while `hapo_dar` is on; with `steps_per_generation > gradient_accumulation_steps` the
    later optimizer steps are off-policy and the zone test is approximated by ratio 1 as well). Padding gets 0 and never enters a statistic.

    Shapes: `advantages` `(N,)`, `ctx.rewards` `(N,)`, `ctx.entropies`/`ctx.completion_mask` `(N, T)`; returns
    `(N, T)`.

    Official code: `starriver030515/HAPO@7671dde3e268779a949954ec75ed3edda45f7e0a`,
    `verl/trainer/ppo/core_algos.py`: `compute_hapo_outcome_advantage` l.296-366 (TLGA: `masked_select` of the
    broadcast score, population std, fallback to `compute_grpo_outcome_advantage` when `|normed| ≥ 5`),
    `compute_entropy_h` l.86-128 (ĥ), `ada_advantage` l.147-156 (DAR), called from `compute_policy_loss`
    l.783-791. Where it differs, and what we do:
    - sign error in `compute_entropy_h`: `scale_neg = 1/neg_min` with `neg_min < 0` makes ĥ ≥ 0 for every token,
      so low-entropy tokens are treated as high-entropy and DAR is a no-op at ratio 1; the paper's ĥ is signed
      (low entropy → ĥ < 0), so we divide by `|neg_min|` (paper wins, per official-code.md);
    - the official fallback test also looks at padding positions (score 0 there, so `|−μ/σ| ≥ 5` can trigger it);
      we test real tokens of scored completions only;
    - the official fallback is GRPO with ε = 1e-6; ours is the incoming advantage (TRL's GRPO uses 1e-4);
    - official entropies are the current policy's at loss time; ours the rollout policy's (detached), equal in
      value for the first (here: only) update.
    Choices: unscored rollouts (NaN reward) and empty completions take no part in any statistic and get 0; an
    all-equal group (and G = 1) gets 0 (σ = 0), so DAR leaves it at 0.
    Not here: Adaptive Temperature Sampling is the generation flag `hapo_adaptive_temperature` (on in this
    variant's registry flags, τ = 0.05; `trl_groupx/sampling/adaptive_temperature.py`), Asymmetric Adaptive Clipping
    the objective `loss_type="hapo_clip"`.
    """
    if ctx.rewards is None or (hapo_dar and ctx.entropies is None):
        raise ValueError("token_weighting='hapo' needs rewards (and rollout entropies for hapo_dar) in the TokenContext.")
    check_groups(advantages.shape[0], ctx.group_size)
    check_rewards("hapo", ctx.rewards)
    adv = clean_advantages("hapo", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    rewards = ctx.rewards.detach().float().to(adv.device)
    if hapo_token_group_norm:
        adv = token_level_group_average(rewards, mask, ctx.group_size, adv, hapo_fallback_threshold)
    token_adv = adv[:, None].expand(mask.shape)
    if hapo_dar:
        h_hat = entropy_h_hat(ctx.entropies.detach().float(), mask, hapo_entropy_pivot)
        token_adv = torch.where(h_hat <= 0, token_adv * (1 + hapo_adv_beta * h_hat), token_adv)
    return torch.where(mask, token_adv, torch.zeros_like(token_adv))
