"""DCPO (Distribution-Centric Policy Optimization, arXiv:2601.12730): entropy control through a tempered target."""

from __future__ import annotations

import math

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, clean_advantages

_COMMIT = "33f8073e302db6cc04a1e064df89242ba8f236b0"
_OFFICIAL = f"597358816/DCPO@{_COMMIT}:verl/trainer/ray_trainer.py"


def _validate(config) -> None:
    target = config.dcpo_entropy_target
    if not (isinstance(target, (int, float)) and math.isfinite(target) and target >= 0):
        raise ValueError(
            f"dcpo_entropy_target must be a finite number ≥ 0 (the target mean negative log-likelihood per token, "
            f"in nats; official script 0.5, the paper's best 0.25), got {target!r}."
        )
    temps = config.dcpo_temperatures
    if (not isinstance(temps, (list, tuple)) or len(temps) != 2
            or not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in temps)):
        raise ValueError(
            f"dcpo_temperatures must be two finite positive temperatures [T_high, T_low] (official [1.2, 0.8]), "
            f"got {temps!r}."
        )
    if temps[0] < temps[1]:
        raise ValueError(
            f"dcpo_temperatures=[T_high, T_low] raises entropy with T_high (used while the entropy is at or below "
            f"the target) and lowers it with T_low; got T_high={temps[0]} < T_low={temps[1]}: swap them."
        )
    cap = config.dcpo_entropy_gap_cap
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise ValueError(
            f"dcpo_entropy_gap_cap must be a finite number > 0 (official 0.1; for plain GRPO unset token_weighting), "
            f"got {cap!r}."
        )
    if not (isinstance(config.dcpo_success_threshold, (int, float)) and math.isfinite(config.dcpo_success_threshold)):
        raise ValueError(
            f"dcpo_success_threshold must be a finite number (official 0.05), got {config.dcpo_success_threshold!r}.")


def dcpo_mixing_weight(previous_entropy: float, success_fraction: float, *, entropy_target: float,
                       entropy_gap_cap: float) -> float:
    """`α = a / (a + 1)` with `a = min(|H0 − H|, cap) / q`; 0 when no rollout succeeded (`q = 0`)."""
    if success_fraction <= 0:
        return 0.0
    a = min(abs(entropy_target - previous_entropy), entropy_gap_cap) / success_fraction
    return a / (a + 1.0)


@register(
    "dcpo",
    name="DCPO (Distribution-Centric Policy Optimization)",
    paper="Distribution-Centric Policy Optimization Dominates Exploration-Exploitation Trade-off, arXiv:2601.12730",
    official_code=_OFFICIAL,
    stage="token_weights",
    flags={"token_weighting": "dcpo", "dcpo_entropy_target": 0.5, "dcpo_temperatures": [1.2, 0.8],
           "dcpo_entropy_gap_cap": 0.1, "dcpo_success_threshold": 0.05, "loss_type": "dual_clip",
           "dual_clip_c": 3.0, "epsilon": 0.2, "epsilon_high": 0.2, "loss_aggregation": "token_mean", "beta": 0.0},
    requires=("old_logps", "tempered_logps"),
    params=("dcpo_entropy_target", "dcpo_temperatures", "dcpo_entropy_gap_cap", "dcpo_success_threshold"),
    stateful=True,
    validate=_validate,
)
def dcpo_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    dcpo_entropy_target: float,
    dcpo_temperatures: list[float],
    dcpo_entropy_gap_cap: float,
    dcpo_success_threshold: float,
    state: dict,
) -> torch.Tensor:
    r"""DCPO: GRPO advantages mixed with a REINFORCE term on successful completions, importance-weighted toward a
    tempered ("target") distribution of the rollout policy, with an entropy-driven mixing weight.

    Per generation batch, with `H` the entropy measured on the previous batch (`state`, 0 before the first):

        T      = T_high if H ≤ H0 else T_low                            (raise entropy / lower it)
        ρ_i,t  = π_old^T(y_i,t) / π_old(y_i,t) = exp(logp^T_i,t − logp_i,t)
        b_i    = 1[r_i > θ]                                             (θ = dcpo_success_threshold)
        q      = Σ_i b_i / #scored rollouts
        a      = min(|H0 − H|, cap) / q,     α = a / (a + 1)
        A'_i,t = (1 − α) · A_i + α · b_i · ρ_i,t

    then `H ← mean over the batch's completion tokens of −logp_i,t` for the next batch. The policy loss then uses
    `A'` as usual (PPO ratio to the rollout policy): the second term is the paper's regulariser, a REINFORCE on
    successful samples whose expectation is taken under the tempered target distribution through `ρ` (double
    importance sampling: `r_i,t` for the update, `ρ_i,t` for the target), sampled fully on-policy.

    Shapes: `advantages` `(N,)`; `ctx.logps`, `ctx.completion_mask` `(N, T)`; `ctx.tempered_logps` `(N, T, 2)` at
    `[T_high, T_low]`; `ctx.rewards` `(N,)`; returns `(N, T)`, 0 on padding. State: `{"entropy": float}`.

    Why the token-weight stage: the catalog files DCPO under the objective ("entropy regulariser"), but the official
    code realises it as a rewrite of the advantages before the standard actor update (the loss function itself is
    EasyR1's unchanged dual-clip PPO loss), and the rewrite is per token (`ρ` varies along the completion). This is
    the stage that turns sequence advantages into per-token advantages, so every loss type can follow it.

    Official code: `597358816/DCPO@33f8073e302db6cc04a1e064df89242ba8f236b0`, `verl/trainer/ray_trainer.py`:
    `RayPPOTrainer.fit`, branch `alg == "DCPO"` l.813-836 (temperature choice l.814-818, `b` via
    `_compute_bool_reward_by_score(threshold=0.05, absolute=False)` l.188-197 on the summed token-level scores,
    log-probs at temperature 1 and at `T` l.822-823 through `_compute_old_log_probs` l.674-685, `α` l.826-832,
    rewrite l.833); the entropy state `entropy = 0` l.730, refreshed after each update from the actor metric
    `actor/entropy_loss` l.844-845, which is `−masked_mean(log_probs)` of the update's forward
    (`verl/workers/actor/dp_actor.py` l.322, logits divided by the temperature l.167) averaged over micro-batches.
    Defaults: `H0 = 0.5` (`examples/qwen-math-7b-DCPO.sh`, `trainer.entropy_base`; the paper reports 0.25 as its
    best), `T ∈ {1.2, 0.8}` and the cap 0.1 and threshold 0.05 (hard-coded in the branch). The loss is EasyR1's
    `core_algos.compute_policy_loss` l.291-362: dual-clip PPO with clip 0.2/0.2 and `c = 3`
    (`verl/workers/actor/config.py` l.82-84), token mean per micro-batch, no KL (`algorithm.disable_kl=true` in
    the script); the flags select the same (`loss_type="dual_clip"`, `loss_aggregation="token_mean"`, `beta=0`).

    Choices (where the official code leaves it open or cannot be followed literally):

    - No successful rollout (`q = 0`): the official division gives `α = NaN` and NaN advantages for the whole
      batch. We use `α = 0`: the target term has no sample to act on, so the batch trains on `A` alone.
    - `H` is measured on the rollout policy in this stage (the no-grad forward that also gives `logp` and
      `logp^T`), as the token mean over the global batch's completion tokens, and used for the *next* batch, like
      the official one-step lag. The official value comes from the update's own forwards (policy moving across
      mini-batches) as a mean of micro-batch means; the two coincide for an on-policy update with one optimizer
      step per generation batch and one micro-batch. A batch without completion tokens leaves `H` unchanged.
    - Temperatures divide the raw logits (`logp^T` as in verl's `logits.div_(T)`); `logp` is at TRL's
      `temperature` (the loss's). With `temperature=1.0` (TRL's default and the official rollout temperature)
      this is the official ratio exactly; otherwise `ρ` compares `T` with the sampling temperature.
    - Unscored rollouts (NaN reward, including rollouts dropped by a sampling filter) get `b = 0`, advantage 0,
      and are left out of `q`'s denominator (the official counts every row, all of which are scored there).
    - `b` reads the weighted sum of the reward functions (the reward behind `A`); the official has one score.

    Edge cases: all-equal groups keep `A = 0` but their successful members still get `α·ρ` (as officially);
    group size plays no role beyond `A`; padding is 0 and never read (not even for `H`); ±inf rewards raise.
    """
    if ctx.logps is None or ctx.tempered_logps is None:
        raise ValueError("token_weighting='dcpo' needs rollout log-probs and tempered log-probs in the TokenContext.")
    if ctx.rewards is None:
        raise ValueError("token_weighting='dcpo' needs the rollouts' rewards in the TokenContext (b = 1[r > θ]).")
    if advantages.dim() != 1:
        raise ValueError(f"token_weighting='dcpo' takes sequence advantages (N,), got {tuple(advantages.shape)}.")
    if ctx.tempered_logps.shape[-1] != len(dcpo_temperatures):
        raise ValueError(f"token_weighting='dcpo': tempered log-probs at {ctx.tempered_logps.shape[-1]} temperatures, "
                         f"expected {len(dcpo_temperatures)} (dcpo_temperatures).")
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("dcpo", advantages, ctx.rewards)  # (N,), 0 where unscored
    mask = ctx.completion_mask.bool()
    previous_entropy = float(state.get("entropy", 0.0))

    rewards = ctx.rewards.detach().to(adv.device)
    scored = ~torch.isnan(rewards)
    success = scored & (torch.nan_to_num(rewards, nan=0.0) > dcpo_success_threshold)
    n_scored = int(scored.sum())
    q = int(success.sum()) / n_scored if n_scored else 0.0
    alpha = dcpo_mixing_weight(previous_entropy, q, entropy_target=dcpo_entropy_target,
                               entropy_gap_cap=dcpo_entropy_gap_cap)

    which = 0 if previous_entropy <= dcpo_entropy_target else 1  # T_high raises a low entropy, T_low lowers it
    logps = torch.where(mask, ctx.logps.detach().float(), torch.zeros_like(adv)[:, None])
    tempered = torch.where(mask, ctx.tempered_logps[..., which].detach().float(), torch.zeros_like(logps))
    ratio = torch.exp(tempered - logps)  # 1 on padding (both 0 there)
    out = (1.0 - alpha) * adv[:, None] + alpha * success.to(adv.dtype)[:, None] * ratio
    out = torch.where(mask, out, torch.zeros_like(out))

    if mask.any():  # mean NLL of the sampled tokens: the official `actor/entropy_loss`, for the next batch
        state["entropy"] = float(-logps[mask].double().mean())
    return out
