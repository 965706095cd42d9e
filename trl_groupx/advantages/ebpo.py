"""EBPO: empirical-Bayes shrinkage of the group baseline toward a running global prior (arXiv:2602.05165)."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite

EBPO_EPS = 1e-4  # added to the batch std (TRL's GRPO constant)
_STATE_KEYS = ("reward_count", "reward_mean", "reward_m2", "group_count", "group_mean", "group_m2", "within_ss",
               "within_dof")


def _validate(config) -> None:
    if config.ebpo_scale_rewards not in ("batch", "none"):
        raise ValueError(f"ebpo_scale_rewards must be 'batch' or 'none', got {config.ebpo_scale_rewards!r}.")


def _merge(count: int, mean: torch.Tensor, m2: torch.Tensor, values: torch.Tensor):
    """Welford/Chan update of (count, mean, M2) with a batch of values (float64): identical to feeding the values
    one by one to Welford's online algorithm, up to rounding."""
    n_b = values.numel()
    if n_b == 0:
        return count, mean, m2
    mean_b = values.mean()
    m2_b = ((values - mean_b) ** 2).sum()
    total = count + n_b
    delta = mean_b - mean
    return total, mean + delta * n_b / total, m2 + m2_b + delta**2 * count * n_b / total


def ebpo_state_stats(state: dict) -> dict:
    """Running statistics held in `state`: global mean/variance of rewards, pooled within-group variance σ² and
    variance of group means τ² (unbiased; NaN where not yet defined)."""
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    n, ng, dof = state["reward_count"], state["group_count"], state["within_dof"]
    return {
        "mean": state["reward_mean"] if n > 0 else nan,
        "var": state["reward_m2"] / (n - 1) if n > 1 else nan,
        "sigma2": state["within_ss"] / dof if dof > 0 else nan,
        "tau2": state["group_m2"] / (ng - 1) if ng > 1 else nan,
    }


@register(
    "ebpo",
    name="EBPO (Empirical Bayes Policy Optimization)",
    paper="EBPO: Empirical Bayes Shrinkage for Stabilizing Group-Relative Policy Optimization, arXiv:2602.05165",
    official_code=None,
    stage="advantages",
    flags={"advantage_estimator": "ebpo", "ebpo_scale_rewards": "batch"},
    params=("ebpo_scale_rewards",),
    stateful=True,
    validate=_validate,
)
def ebpo_advantages(
    rewards: torch.Tensor, group_size: int, *, ebpo_scale_rewards: str = "batch", state: dict
) -> torch.Tensor:
    r"""EBPO: the group baseline is shrunk toward a global prior built from every reward seen so far.

    Running statistics (kept in `state`, updated with the current batch *before* the advantages are computed):
    the global reward mean `μ` and variance (Welford), the pooled within-group variance
    `σ² = Σ_g Σ_i (r_gi − r̄_g)² / Σ_g (n_g − 1)` and the variance `τ²` of group means (Welford over group means).
    For group `g` with `n_g` scored members and mean `r̄_g`:

    `S_g = (σ²/n_g) / (σ²/n_g + τ²)`,  `b_g = (1 − S_g) r̄_g + S_g μ`,  `A_i = (r_i − b_g) / (s + 1e-4)`

    with `s` the unbiased std of the batch's rewards (`ebpo_scale_rewards="batch"`, official-code.md: "final
    normalisation is batch-level") or `s + 1e-4 := 1` (`"none"`). An all-wrong group in a run whose prior mean is
    above 0 gets `A_i = −S_g μ / (s + ε) < 0` for every member (the paper's non-vanishing penalty); `S_g → 0` as
    `n_g` grows (the local mean takes over); `G = 1` still gets `A = S (r − μ)/(s + ε)`.

    Shapes: `rewards (N,)` → `(N,)`. State: plain ints and float64 scalar tensors (saved with checkpoints).

    Citation: arXiv:2602.05165, Alg. 1 (no public code). What official-code.md records from the paper:
    `S = (σ²/G)/(σ²/G + τ²)`, batch-level std, σ² and τ² running variances over the run (Welford). The method
    text itself was not available here, so these are **our choices** where it is open:

    - σ² is the pooled within-group variance and τ² the plain variance of group means (no method-of-moments
      correction `τ² − σ²/G`); both unbiased, accumulated over the whole run (no decay).
    - The state is updated with the current batch first, so the first step already has a prior (its own batch).
    - Batch scaling divides by the batch reward std without re-centring the advantages (re-centring would undo
      the negative signal of all-wrong groups). When the batch has no spread (`s = 0`, e.g. an all-zero batch)
      the running global std is used instead, to avoid a `1/ε` blow-up; if that is 0 too, no scaling.
    - Degenerate statistics: undefined σ² (no group with two scored members yet) counts as 0 (no shrinkage);
      undefined τ² counts as 0; `σ²/n_g + τ² = 0` gives `S = 0`.
    - NaN rewards are excluded from every statistic (and from the state) and get 0; an all-NaN group gets 0.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards (NaN where unscored; ±inf raises).
        group_size (`int`): `G`.
        ebpo_scale_rewards (`str`): `"batch"` or `"none"`.
        state (`dict`): running statistics, read and updated in place.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "ebpo")
    if rewards.dim() != 1:
        raise ValueError(f"advantage_estimator='ebpo' needs rewards of shape (N,); got {tuple(rewards.shape)}.")
    if not state:
        zero = torch.zeros((), dtype=torch.float64)
        state.update({"reward_count": 0, "reward_mean": zero, "reward_m2": zero, "group_count": 0,
                      "group_mean": zero, "group_m2": zero, "within_ss": zero, "within_dof": 0})
    r = rewards.detach().to(torch.float64).cpu()
    by_group = grouped(r, group_size)  # (B, G)
    scored = ~torch.isnan(by_group)
    n_g = scored.sum(dim=1)  # (B,)
    group_mean = torch.nanmean(by_group, dim=1)  # NaN for all-NaN groups
    has_any = n_g > 0

    # --- update the running statistics with this batch ---
    state["reward_count"], state["reward_mean"], state["reward_m2"] = _merge(
        state["reward_count"], state["reward_mean"], state["reward_m2"], r[~torch.isnan(r)])
    state["group_count"], state["group_mean"], state["group_m2"] = _merge(
        state["group_count"], state["group_mean"], state["group_m2"], group_mean[has_any])
    state["within_ss"] = state["within_ss"] + ((by_group - group_mean.unsqueeze(1)) ** 2).nansum()
    state["within_dof"] = state["within_dof"] + int((n_g - 1).clamp(min=0).sum())
    stats = ebpo_state_stats(state)

    # --- shrinkage baseline ---
    sigma2, tau2 = stats["sigma2"].nan_to_num(0.0), stats["tau2"].nan_to_num(0.0)
    noise = sigma2 / n_g.clamp(min=1).to(torch.float64)  # (B,)
    denom = noise + tau2
    shrink = torch.where(denom > 0, noise / torch.where(denom > 0, denom, torch.ones_like(denom)),
                         torch.zeros_like(denom))
    baseline = (1 - shrink) * group_mean + shrink * stats["mean"]
    centred = (by_group - baseline.unsqueeze(1)).reshape(-1)

    if ebpo_scale_rewards == "batch":
        finite = r[~torch.isnan(r)]
        spread = finite.std() if finite.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        if not spread > 0:
            spread = stats["var"].nan_to_num(0.0).sqrt()
        if spread > 0:
            centred = centred / (spread + EBPO_EPS)
    return torch.nan_to_num(centred, nan=0.0).to(rewards.dtype).to(rewards.device)
