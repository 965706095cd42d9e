"""HGPO (Hierarchy-of-Groups Policy Optimization): hierarchical history-consistent step groups with adaptive
weighting (ICLR 2026, arXiv:2602.22817).

Dispatched with `advantage_estimator="hgpo"` (requires `step_structure`: the trainer supplies `steps`, see
`trl_groupx.contracts`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import (
    VERL_EPS,
    StepBatch,
    check_steps,
    dense_by_episode,
    discounted_returns,
    episode_advantages,
    segment_normalize,
)

HGPO_MODES = ("mean_std_norm", "mean_norm")
HGPO_EPISODE_STATS = ("trajectory", "steps")


def _validate(config) -> None:
    if config.hgpo_mode not in HGPO_MODES:
        raise ValueError(f"hgpo_mode must be one of {HGPO_MODES}, got {config.hgpo_mode!r}.")
    if config.hgpo_episode_stats not in HGPO_EPISODE_STATS:
        raise ValueError(f"hgpo_episode_stats must be one of {HGPO_EPISODE_STATS}, got {config.hgpo_episode_stats!r}.")
    if not isinstance(config.hgpo_history_length, int) or config.hgpo_history_length < 0:
        raise ValueError(f"hgpo_history_length must be an integer >= 0, got {config.hgpo_history_length!r}.")
    if not 0.0 <= config.hgpo_gamma <= 1.0:
        raise ValueError(f"hgpo_gamma must lie in [0, 1], got {config.hgpo_gamma}.")


@register(
    "hgpo",
    name="HGPO (Hierarchy-of-Groups Policy Optimization)",
    paper="Hierarchy-of-Groups Policy Optimization for Long-Horizon Agentic Tasks, ICLR 2026, arXiv:2602.22817",
    official_code="langfengQ/verl-agent@20bd331bdbc9026a5668e11362178e10ab7400c8:recipe/hgpo/core_hgpo.py",
    stage="advantages",
    requires=("step_structure",),
    needs=("multi-turn rollouts with hashable states: rollout_func fields step_states/step_rewards or an environment "
           "with _step_structure()",),
    params=("hgpo_gamma", "hgpo_history_length", "hgpo_mode", "hgpo_length_weight_alpha", "hgpo_base_group",
            "hgpo_episode_stats"),
    validate=_validate,
)
def hgpo_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    hgpo_gamma: float = 0.95,
    hgpo_history_length: int = 2,
    hgpo_mode: str = "mean_std_norm",
    hgpo_length_weight_alpha: float = 1.0,
    hgpo_base_group: bool = False,
    hgpo_episode_stats: str = "steps",
) -> torch.Tensor:
    """HGPO per-step advantages. For step `t` of an episode of prompt group `g`, and each history depth
    `k = 1 … min(H + 1, t + 1)` (`H = hgpo_history_length`), the level-`k` group is

        U_k(t) = {steps t' of group g whose last k anchor states (s_{t'−k+1}, …, s_{t'}) equal (s_{t−k+1}, …, s_t)}

    (k = 1 is GiGPO's anchor-state group; larger k demand a longer consistent history). With `G_t` the discounted
    return (γ = `hgpo_gamma`) and only groups of at least 2 members,

        a_k(t) = (G_t − mean_{U_k(t)} G) / (std_{U_k(t)} G + ε),   std the POPULATION std,   ε = 1e-6,
        A_t    = Σ_{k ∈ K(t)} w_k a_k(t),   w_k = (k + 1)^α / (Σ_{k' ∈ K(t)} (k' + 1)^α + ε),
        K(t)   = {k : |U_k(t)| ≥ 2 and a_k(t) ≠ 0}                        (zero-valued level advantages dropped)

    so deeper (more context-consistent, lower-bias) groups weigh more (α = `hgpo_length_weight_alpha`). A step with
    no level left gets 0. `hgpo_base_group=True` adds the episode-level advantage as a level `k = 0` (weight 1^α).

    Official code: zzj1111/alfworldauto (langfengQ/verl-agent history) @20bd331bdbc9026a5668e11362178e10ab7400c8:
    recipe/hgpo/core_hgpo.py: `hgpo_advantage_estimate` (clusters keyed by `(k, tuple(last k hashed obs))` inside
    each `index` group, `nL <= 1` skipped, `r.std(unbiased=False)`, `aggregate_items` with `valid_mask = advs != 0`
    and `w = L**alpha / (sum + eps)`, `L = k + 1`), `trajectory_advantages` (base group, = GiGPO's episode level with
    `compute_mean_std_cross_steps=True`), `compute_step_discounted_returns`; recipe/hgpo/config/hgpo_trainer.yaml
    (`mode: mean_std_norm`, `length_weight_alpha: 1.0`, `base_group: false`; `weight_type: "length"` is read by
    nothing) and run_qwen2.5_1.5b_alfworld_train.sh (`history_length=2`, `gamma=0.95`).

    Choices:
        * Population std at the levels and the dropping of exactly-zero level advantages before the weights are
          normalised are the official code's, kept on purpose (GiGPO, by contrast, uses the unbiased std). A
          level whose values are all equal therefore never contributes, and a step that sits exactly at its
          group's mean loses that level's weight.
        * Step order inside an episode is `StepBatch.index` (official: row order in the batch, the same thing for
          verl-agent's step-major layout).
        * The base group (off by default) uses `hgpo_episode_stats="steps"` (official) or `"trajectory"`.
        * NaN episode reward: every step of the episode is left out of all groups and gets 0. NaN step returns
          (a NaN step reward at or after the step) are left out of the groups and get 0. ±inf raises.

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` episode outcomes (only for NaN masking and the base group).
        group_size (`int`): `G`.
        steps (`StepBatch`): the `S` steps (episode, index, anchor-state key, step reward).

    Returns:
        `torch.Tensor`: `(S,)` per-step advantages.
    """
    flag = "advantage_estimator='hgpo'"
    check_steps(episode_rewards, group_size, steps, flag)
    if hgpo_mode not in HGPO_MODES:
        raise ValueError(f"hgpo_mode must be one of {HGPO_MODES}, got {hgpo_mode!r}.")
    if hgpo_episode_stats not in HGPO_EPISODE_STATS:
        raise ValueError(f"hgpo_episode_stats must be one of {HGPO_EPISODE_STATS}, got {hgpo_episode_stats!r}.")
    if not isinstance(hgpo_history_length, int) or hgpo_history_length < 0:
        raise ValueError(f"hgpo_history_length must be an integer >= 0, got {hgpo_history_length!r}.")
    if not 0.0 <= hgpo_gamma <= 1.0:
        raise ValueError(f"hgpo_gamma must lie in [0, 1], got {hgpo_gamma}.")
    scale = hgpo_mode == "mean_std_norm"
    n, s = episode_rewards.shape[0], steps.num_steps
    if s == 0:
        return torch.zeros(0)
    valid_ep = ~torch.isnan(episode_rewards)
    returns = discounted_returns(steps, n, hgpo_gamma)
    step_valid = valid_ep[steps.episode] & ~torch.isnan(returns)

    # History matrix: hist[i, j] = anchor key of the step j positions before step i (j = 0: its own state).
    dense_state, rank = dense_by_episode(steps.state, steps, n, fill=0)
    levels = hgpo_history_length + 1
    back = rank[:, None] - torch.arange(levels)[None, :]                       # (S, K) rank of the j-th previous
    hist = dense_state[steps.episode[:, None], back.clamp(min=0)]              # (S, K)
    group = (steps.episode // group_size)[:, None]

    # One row per (step, level k): key = (prompt group, k, s_t, s_{t-1}, …, s_{t-k+1}, 0 padding). k is in the key,
    # so the zero padding never merges levels. torch.unique over the rows gives the level-k group ids exactly.
    ks = torch.arange(1, levels + 1)                                           # (K,)
    exists = rank[:, None] >= (ks[None, :] - 1)                                # (S, K) level k needs t ≥ k − 1
    keep_cols = torch.arange(levels)[None, None, :] < ks[None, :, None]        # (1, K, K) first k history entries
    keys = torch.where(keep_cols, hist[:, None, :], torch.zeros((), dtype=torch.long))  # (S, K, K)
    rows = torch.cat([group.expand(s, levels)[..., None], ks.expand(s, levels)[..., None], keys], dim=-1)
    flat_rows = rows.reshape(s * levels, -1)
    flat_valid = (exists & step_valid[:, None]).reshape(-1)
    _, segments = torch.unique(flat_rows, dim=0, return_inverse=True)
    segments = torch.where(flat_valid, segments, torch.full_like(segments, -1))  # invalid rows: own dummy segment
    level_adv, wsum = segment_normalize(returns.repeat_interleave(levels), segments, flat_valid, scale=scale,
                                        unbiased=False, eps=VERL_EPS)
    level_adv = level_adv.view(s, levels).double()
    present = (flat_valid & (wsum >= 2)).view(s, levels) & (level_adv != 0)
    weight_len = (ks + 1).double()                                             # L = k + 1

    if hgpo_base_group:
        base = episode_advantages(episode_rewards, group_size, steps, stats=hgpo_episode_stats, scale=scale,
                                  unbiased=True, eps=VERL_EPS).double()
        level_adv = torch.cat([base[:, None], level_adv], dim=1)
        present = torch.cat([(valid_ep[steps.episode] & (base != 0))[:, None], present], dim=1)
        weight_len = torch.cat([torch.ones(1, dtype=torch.float64), weight_len])

    w_raw = torch.where(present, weight_len[None, :] ** hgpo_length_weight_alpha, torch.zeros((), dtype=torch.float64))
    w = w_raw / (w_raw.sum(dim=1, keepdim=True) + VERL_EPS)
    adv = (w * torch.where(present, level_adv, torch.zeros((), dtype=torch.float64))).sum(dim=1)
    return torch.where(valid_ep[steps.episode], adv, torch.zeros_like(adv)).to(torch.float32)
