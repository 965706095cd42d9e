"""Clip-Cov and KL-Cov (arXiv:2505.22617): restrain the few tokens whose advantage × log-prob covariance drives
entropy collapse."""

from __future__ import annotations

import torch

from ..contracts import ObjectiveContext
from ..registry import register

PAPER = "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models, arXiv:2505.22617"
OFFICIAL = "PRIME-RL/Entropy-Mechanism-of-RL@88505792fd97a11993445e93195145e3c1181955:verl/trainer/ppo/core_algos.py"


def _centred_cov(adv: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(A_t - mean A)(logp_t - mean logp)` per token `(B, T)`, means over the real tokens of the micro-batch."""
    valid = mask > 0
    n = valid.sum().clamp(min=1)
    adv_mean = (adv * mask).sum() / n
    logp_mean = (logps * mask).sum() / n
    return (adv - adv_mean) * (logps - logp_mean)


def _validate_clip_cov(config) -> None:
    if not 0 < config.clip_cov_ratio <= 1:
        raise ValueError(f"clip_cov_ratio={config.clip_cov_ratio!r} must be in (0, 1]; the paper uses 2e-4.")
    if not config.clip_cov_lb < config.clip_cov_ub:
        raise ValueError(
            f"clip_cov_lb={config.clip_cov_lb!r} must be below clip_cov_ub={config.clip_cov_ub!r} (paper: 1 and 5)."
        )


def _validate_kl_cov(config) -> None:
    if not 0 < config.kl_cov_ratio <= 1:
        raise ValueError(f"kl_cov_ratio={config.kl_cov_ratio!r} must be in (0, 1]; the paper uses 2e-3 (7B).")
    if not config.kl_cov_coef >= 0:
        raise ValueError(f"kl_cov_coef={config.kl_cov_coef!r} must be >= 0; the paper uses 1.")


@register(
    "clip_cov",
    name="Clip-Cov (entropy mechanism)",
    paper=PAPER,
    official_code=OFFICIAL,
    stage="objective",
    flags={"loss_type": "clip_cov", "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "epsilon": 1.0,
           "epsilon_high": 1.0, "beta": 0.0, "loss_aggregation": "global_token_mean"},
    params=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"),
    validate=_validate_clip_cov,
)
def clip_cov_surrogate(
    ctx: ObjectiveContext,
    *,
    epsilon: float,
    epsilon_high: float | None,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
) -> torch.Tensor:
    """Clip-Cov: PPO's clipped surrogate with the gradient cut on a few random high-covariance tokens, `(B, T)`.

        l_t = max(-A_t ρ_t, -A_t clip(ρ_t, 1-ε_low, 1+ε_high)) · (1 - c_t)
        cov_t = (A_t - mean A)(logp_t - mean logp)                 (means over the micro-batch's real tokens)
        c_t = 1 on max(1, ⌊r · #tokens⌋) tokens drawn uniformly among those with lb < cov_t < ub, not already
              clipped by PPO and not padding (r = clip_cov_ratio, lb/ub = clip_cov_lb/ub); 0 elsewhere.

    A selected token's loss is zeroed, value and gradient. The draw uses torch's global generator (`randperm`),
    so it follows `seed`. Paper defaults (official scripts `recipe/dapo/7b_clip_cov.sh`, `32b_clip_cov.sh`):
    r = 2e-4, lb = 1, ub = 5, PPO bounds `clip_ratio_low = clip_ratio_high = 1` (ratios in [0, 2]: the flags set
    `epsilon = epsilon_high = 1`), no KL, token-mean aggregation (`global_token_mean`).

    Convention: as in the official code (PRIME-RL/Entropy-Mechanism-of-RL@88505792fd97a11993445e93195145e3c1181955,
    `verl/trainer/ppo/core_algos.py:compute_policy_loss_clip_cov` l.469-513) and verl's port
    (verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9, `core_algos.py:compute_policy_loss_clip_cov`
    l.1742-1844), the covariance means and the number of tokens selected are computed per micro-batch (the loss
    function's input), so the set of selected tokens depends on the micro-batch size; the aggregation does not.
    No dual clip (verl applies it only in `vanilla`); no log-ratio clamp (neither implementation has one); the
    log-ratio is zeroed at padding so that an extreme padded value cannot turn into `inf·0 = NaN` gradients.
    KL: none in the official scripts (`beta=0` in the flags); with `beta != 0` the trainer adds TRL's k3, times the
    ratio when `use_bias_correction_kl` (TRL's default), where verl would add an unweighted k3.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    mask = ctx.mask
    adv = ctx.advantages.expand_as(ctx.logps)
    ratio = torch.exp((ctx.logps - ctx.old_logps) * mask)  # padding → ratio 1: never inf, never read
    unclipped, clipped = -adv * ratio, -adv * torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    with torch.no_grad():
        cov = _centred_cov(adv, ctx.logps.detach(), mask)
        candidates = (cov > clip_cov_lb) & (cov < clip_cov_ub) & (mask > 0) & ~(clipped > unclipped)
        idx = torch.nonzero(candidates)
        n_cut = max(int(clip_cov_ratio * mask.sum().item()), 1)
        idx = idx[torch.randperm(len(idx), device=idx.device)[:n_cut]] if len(idx) else idx
        keep = torch.ones_like(ctx.logps)
        keep[idx[:, 0], idx[:, 1]] = 0.0
    return torch.maximum(unclipped, clipped) * keep


@register(
    "kl_cov",
    name="KL-Cov (entropy mechanism)",
    paper=PAPER,
    official_code=OFFICIAL,
    stage="objective",
    flags={"loss_type": "kl_cov", "kl_cov_ratio": 2e-3, "kl_cov_coef": 1.0, "beta": 0.0,
           "loss_aggregation": "global_token_mean"},
    params=("kl_cov_ratio", "kl_cov_coef"),
    validate=_validate_kl_cov,
)
def kl_cov_surrogate(ctx: ObjectiveContext, *, kl_cov_ratio: float, kl_cov_coef: float) -> torch.Tensor:
    """KL-Cov: unclipped policy gradient, with a `|log ρ|` penalty on the top-k covariance tokens, `(B, T)`.

        l_t = -A_t ρ_t + β · |logp_t - logp_old_t| · 1[t ∈ top-k cov]      (β = kl_cov_coef)
        cov_t = (A_t - mean A)(logp_t - mean logp) over the micro-batch's real tokens (detached);
        k = max(1, ⌊kl_cov_ratio · #tokens⌋)

    There is no ratio clipping at all: the trust region is the penalty on the selected tokens. On-policy
    (ρ = 1) the penalty and its gradient are 0 (torch's `|x|'` at 0 is 0), so the step is GRPO's.

    Defaults: official scripts `recipe/dapo/7b_kl_cov.sh` (`k_percent=0.2`, i.e. 0.2 % = 2e-3 of tokens) and
    `32b_kl_cov.sh` (0.02 % = 2e-4, verl's default `kl_cov_ratio`); we default to the 7B value since the recipes
    here train ≤ 7B models. `ppo_kl_coef = 1`, no reference KL, token-mean aggregation.

    Convention: official PRIME-RL/Entropy-Mechanism-of-RL@88505792fd97a11993445e93195145e3c1181955,
    `verl/trainer/ppo/core_algos.py:compute_policy_loss_kl_cov` l.426-467 (ratio given in percent there); verl
    `core_algos.py:compute_policy_loss_kl_cov` l.1847-1924 (ratio as a fraction, as here). Selection is per
    micro-batch, as in both (the selected set depends on the micro-batch size; the aggregation does not). Ties in
    the covariance are broken by `torch.topk`. The log-ratio is zeroed at padding (values there are never used).
    No dual clip, no ratio clip (as in both implementations). Reference KL: as for `clip_cov`.
    """
    mask = ctx.mask
    adv = ctx.advantages.expand_as(ctx.logps)
    log_ratio = (ctx.logps - ctx.old_logps) * mask  # padding → 0: never inf, never read
    loss = -adv * torch.exp(log_ratio)
    with torch.no_grad():
        valid = (mask > 0).flatten()
        cov = _centred_cov(adv, ctx.logps.detach(), mask).flatten()
        cov = torch.where(valid, cov, torch.full_like(cov, -torch.inf))
        k = max(1, int(valid.sum().item() * kl_cov_ratio)) if valid.any() else 0
        penalised = torch.zeros_like(cov)
        penalised[torch.topk(cov, k).indices] = 1.0
        penalised = penalised.view_as(loss) * mask
    return loss + kl_cov_coef * log_ratio.abs() * penalised
