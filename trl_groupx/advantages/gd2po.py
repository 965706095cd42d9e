"""GD²PO: per-reward group normalisation with conflict filtering and group keep-ratio reweighting."""

from __future__ import annotations

import torch

from ..contracts import grouped
from ..registry import register
from ._checks import reject_infinite
from .mo_grpo import per_function_group_zscores, reward_weight_vector

# Official constants (verl): group std epsilon, sign threshold, ratio epsilon, whitening epsilon.
GD2PO_STD_EPS = 1e-6
_SIGN_EPS = 1e-8
_RATIO_EPS = 1e-8
_WHITEN_EPS = 1e-8


def _validate(config) -> None:
    if not 0.0 <= config.gd2po_conflict_threshold <= 1.0:
        raise ValueError(
            f"gd2po_conflict_threshold must lie in [0, 1] (1.0 drops every sign conflict, the 'hard' variant; the "
            f"official 'snr' script uses 0.8), got {config.gd2po_conflict_threshold}."
        )


def conflict_keep_mask(z: torch.Tensor, threshold: float) -> torch.Tensor:
    """`(N, K)` per-reward advantages → `(N,)` keep mask: drop rollouts with mixed signs (beyond ±1e-8) whose
    consensus `|Σ_k z_k| / (Σ_k |z_k| + 1e-8)` is below `threshold` (official `_get_mixed_sign_conflict_mask` and
    `_compute_gdpo_ratio_conflict_advantages`)."""
    conflict = (z > _SIGN_EPS).any(dim=1) & (z < -_SIGN_EPS).any(dim=1)
    consensus = z.sum(dim=1) / (z.abs().sum(dim=1) + _RATIO_EPS)
    return ~(conflict & (consensus.abs() < threshold))


@register(
    "gd2po",
    name="GD²PO (Group-Dynamic reward-Decoupled Policy Optimization)",
    paper="GD²PO: Mitigating Multi-Reward Conflicts via Group-Dynamic reward-Decoupled Policy Optimization, "
    "arXiv:2606.16771",
    official_code="Qwen-Applications/GD2PO@f1ad765bc9a330e6cf387f95e9c1e5a6c4bb2d02:tool-calling/verl/trainer/ppo/"
    "ray_trainer.py",
    stage="advantages",
    flags={"advantage_estimator": "gd2po", "gd2po_conflict_threshold": 0.8},
    params=("gd2po_conflict_threshold",),
    requires=("rewards_per_func",),
    validate=_validate,
)
def gd2po_advantages(
    rewards: torch.Tensor, group_size: int, *, gd2po_conflict_threshold: float = 0.8, reward_weights=None
) -> torch.Tensor:
    r"""GD²PO advantages: GDPO's per-reward group z-scores, minus conflicting rollouts, scaled by the group's keep
    ratio, then whitened over the kept rollouts of the batch.

    1. `z_ik = w_k (r_ik − mean_g(r_k)) / (std_g(r_k) + 1e-6)` (unbiased std; `w_k` TRL's `reward_weights`,
       default 1 as in the official code).
    2. Conflict: rollout `i` has some `z_ik > 1e-8` and some `z_ik < −1e-8`. Consensus ratio
       `ρ_i = Σ_k z_ik / (Σ_k |z_ik| + 1e-8)`. Rollout `i` is dropped when it conflicts and `|ρ_i| < τ`
       (`τ = gd2po_conflict_threshold`; `τ = 1` drops every conflict: the official "hard" estimator
       `gdpo_filter_group_ratio`; `τ = 0.8` the "snr" estimator `gdpo_filter_ratio_conflict_group_ratio` as run by
       `scripts/*/train_gd2po_snr.sh`; `τ = 0` keeps all).
    3. `s_i = κ_q · Σ_k z_ik` with `κ_q` = kept / scored rollouts of `i`'s group (query-level consensus weight,
       applied before whitening so that whitening does not erase it).
    4. `A_i = keep_i · (s_i − mean_kept(s)) / sqrt(var_kept(s) + 1e-8)` over the kept rollouts of the whole batch
       (unbiased variance); dropped rollouts get 0.

    With one reward function nothing conflicts and `κ = 1`: GDPO (per-reward z-score then batch whitening), up to
    the epsilons. Note that step 4 can flip the sign of a rollout whose `s_i` is positive but below the batch mean
    (official-code.md).

    Shapes: `rewards (N, K)` (a `(N,)` vector is read as `K = 1`) → `(N,)`.

    Citation: arXiv:2606.16771; official code Qwen-Applications/GD2PO@f1ad765bc9a330e6cf387f95e9c1e5a6c4bb2d02:
    tool-calling/verl/trainer/ppo/ray_trainer.py: `_compute_active_gdpo_advantages`, `_get_mixed_sign_conflict_mask`,
    `_apply_gdpo_keep_mask`, `_compute_gdpo_group_keep_ratio`, `_compute_gdpo_ratio_conflict_advantages`
    (l.243-390) and `compute_advantage` (l.393-503, branches `GDPO_Filter_GroupRatio`,
    `GDPO_Filter_RatioConflict_GroupRatio`);
    per-reward GRPO from verl/trainer/ppo/core_algos.py:compute_grpo_outcome_advantage (l.250-311).

    Differences from the official code, and choices:

    - Whitening: verl's `masked_whiten` takes mean and variance over the kept *tokens* (longer responses weigh
      more); this stage has no lengths, so each kept rollout counts once. One-token responses give identical
      numbers; equal lengths `L` differ only by the Bessel factor (`nL/(nL−1)` there, `n/(n−1)` here).
    - A group with a single scored member gets `z = 0` (verl uses mean 0, std 1 there, i.e. `z = r`).
    - NaN entries are left out of their function's statistics and add 0 to the sums; the keep ratio counts scored
      rollouts only; a rollout no function scored is dropped (advantage 0). With one kept rollout in the whole
      batch its whitened advantage is 0.
    - `reward_weights` multiplies the z-scores (the official code has no weights).

    Args:
        rewards (`torch.Tensor`): `(N, K)` per-function rewards (NaN where unscored; ±inf raises).
        group_size (`int`): `G`.
        gd2po_conflict_threshold (`float`): `τ ∈ [0, 1]`.
        reward_weights (`list[float]` or `None`): TRL's `reward_weights`.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "gd2po")
    matrix = rewards.unsqueeze(1) if rewards.dim() == 1 else rewards
    weights = reward_weight_vector(reward_weights, matrix.shape[1], matrix, "gd2po")
    z = per_function_group_zscores(matrix, group_size, GD2PO_STD_EPS) * weights
    scored = ~torch.isnan(matrix).all(dim=1)
    z = z.nan_to_num(0.0)
    keep = scored & conflict_keep_mask(z, gd2po_conflict_threshold)

    kept_per_group = grouped(keep.to(z.dtype), group_size).sum(dim=1)
    scored_per_group = grouped(scored.to(z.dtype), group_size).sum(dim=1)
    keep_ratio = (kept_per_group / scored_per_group.clamp(min=1.0)).repeat_interleave(group_size)
    summed = z.sum(dim=1) * keep_ratio

    n_kept = keep.sum()
    if n_kept == 0:
        return torch.zeros_like(summed)
    kept_values = summed[keep]
    mean = kept_values.mean()
    var = kept_values.var(unbiased=True) if n_kept > 1 else torch.zeros((), dtype=summed.dtype)
    whitened = (summed - mean) * torch.rsqrt(var + _WHITEN_EPS)
    return torch.where(keep, whitened, torch.zeros_like(whitened))
