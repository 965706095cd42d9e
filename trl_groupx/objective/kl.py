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
