"""Per-token estimators of the KL penalty to the reference policy (TRL ships only `k3`).

With samples `y_t ~ π_θ` and `δ_t = log π_ref(y_t) - log π_θ(y_t)` (TRL's sign), the estimators of J. Schulman,
"Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html) are

- `k1 = -δ`                  unbiased for KL(π_θ‖π_ref), high variance, can be negative;
- `k2 = δ² / 2`              biased, low variance, ≥ 0;
- `k3 = exp(δ) - δ - 1`      unbiased, low variance, ≥ 0 (TRL's, DeepSeekMath's GRPO);
- `abs = |δ|`                biased, ≥ 0 (listed among the estimators compared in the literature).

Used as a loss term (`β · k`, differentiated through `log π_θ` only, as every trainer does), their gradients differ
from their values' meaning. On-policy, `E[∇k1] = E[∇ log π_θ] = 0` (k1 adds no KL gradient in expectation);
`E[∇k2] = E[(log π_θ - log π_ref) ∇ log π_θ] = ∇ KL(π_θ‖π_ref)` (the reverse-KL gradient);
`E[∇k3] = E[(1 - π_ref/π_θ) ∇ log π_θ] = ∇ KL(π_ref‖π_θ)` (the forward-KL gradient); `∇abs = sign(-δ) ∇ log π_θ`.
These identities follow from `E_{π_θ}[f ∇ log π_θ] = Σ_y f ∇π_θ`; they are why the choice matters, and why
`kl_estimator` is exposed rather than fixed.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "abs")


def per_token_kl(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """KL penalty per token, `(B, T)` from `(B, T)` policy and reference log-probs, by `estimator` (see module doc).

    `k3` is computed exactly as TRL 1.16's `GRPOTrainer._compute_loss` does, so the default is bit-identical to TRL.
    """
    delta = ref_logps - logps
    if estimator == "k3":
        return torch.exp(delta) - delta - 1
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta**2
    if estimator == "abs":
        return delta.abs()
    raise ValueError(f"kl_estimator={estimator!r} is unknown; use one of {KL_ESTIMATORS}.")


def kl_coefficient(beta: float, beta_negative: float | None, advantages: torch.Tensor) -> float | torch.Tensor:
    """`β` for the KL penalty of each row (or token, with `(B, T)` advantages): `beta_negative` where `A < 0`.

    MDP-GRPO's asymmetric KL ("MDP-GRPO: Stabilized Group Relative Policy Optimization for Multi-Constraint
    Instruction Following", ACL 2026; its advantage side is `trl_groupx.advantages.mdp_grpo`): a looser leash
    when the update reinforces (A ≥ 0, `β+ = beta`) and a tighter one when it penalises (A < 0, `β− =
    beta_negative`). Official code: m-salmani78/trl@3b375080d799c1a7224de19d37e548a2ed2aa390,
    `trl/trainer/grpo_trainer.py` `_compute_loss` l.2139-2149 (`beta_eff = where(A < 0, beta_neg, beta_pos)`, per
    completion, added as `beta_eff · kl` per token); defaults `beta_pos = 0.01`, `beta_neg = 0.025`
    (`grpo_config.py`). Zero advantage counts as non-negative, as there.

    Args:
        beta (`float`): `β+`, the run's `beta`.
        beta_negative (`float` or `None`): `β−`; `None` returns `beta` (TRL's symmetric penalty).
        advantages (`torch.Tensor`): `(B, 1)` or `(B, T)`.
    """
    if beta_negative is None:
        return beta
    return torch.where(advantages < 0, advantages.new_tensor(beta_negative), advantages.new_tensor(beta))
