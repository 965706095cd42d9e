"""GiGPO (Group-in-Group Policy Optimization): episode-level plus anchor-state step-level groups
(arXiv:2505.10978).

Dispatched with `advantage_estimator="gigpo"` (requires `step_structure`: the trainer supplies `steps`, see
`trl_groupx.contracts`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import VERL_EPS, StepBatch, check_steps, discounted_returns, episode_advantages, segment_normalize

GIGPO_MODES = ("mean_std_norm", "mean_norm")
GIGPO_EPISODE_STATS = ("trajectory", "steps")


def _validate(config) -> None:
    if config.gigpo_mode not in GIGPO_MODES:
        raise ValueError(f"gigpo_mode must be one of {GIGPO_MODES}, got {config.gigpo_mode!r}.")
    if config.gigpo_episode_stats not in GIGPO_EPISODE_STATS:
        raise ValueError(f"gigpo_episode_stats must be one of {GIGPO_EPISODE_STATS}, got "
                         f"{config.gigpo_episode_stats!r}.")
    if not 0.0 <= config.gigpo_gamma <= 1.0:
        raise ValueError(f"gigpo_gamma must lie in [0, 1], got {config.gigpo_gamma}.")


@register(
    "gigpo",
    name="GiGPO (Group-in-Group Policy Optimization)",
    paper="Group-in-Group Policy Optimization for LLM Agent Training, arXiv:2505.10978",
    official_code="langfengQ/verl-agent@20bd331bdbc9026a5668e11362178e10ab7400c8:gigpo/core_gigpo.py",
    stage="advantages",
    requires=("step_structure",),
    needs=("multi-turn rollouts with hashable states: rollout_func fields step_states/step_rewards or an environment "
           "with _step_structure()",),
    params=("gigpo_gamma", "gigpo_step_advantage_w", "gigpo_mode", "gigpo_episode_stats"),
    validate=_validate,
)
def gigpo_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    gigpo_gamma: float = 0.95,
    gigpo_step_advantage_w: float = 1.0,
    gigpo_mode: str = "mean_std_norm",
    gigpo_episode_stats: str = "trajectory",
) -> torch.Tensor:
    """GiGPO per-step advantages `A = A^E + ω·A^S` (Eq. 8):

        A^E_e   = (R_e − mean_g R) / (std_g R + ε)                                  episode level (Eq. 3)
        G_t     = Σ_{t' ≥ t} γ^{t'−t} r_{t'}                                         discounted step return (Eq. 5)
        U_{g,s} = {steps of group g whose anchor state is s}                         anchor-state groups (Eq. 6)
        A^S_t   = (G_t − mean_{U(t)} G) / (std_{U(t)} G + ε)                        step level (Eq. 7)

    `g` is the prompt group (the `G` episodes of one task, started from the same state), std is unbiased
    (`torch.std`), ε = 1e-6; `gigpo_mode="mean_norm"` drops both std divisions (official `remove_std=True`).

    Official code: zzj1111/alfworldauto (a fork carrying langfengQ/verl-agent's history verbatim; upstream could not
    be fetched) @20bd331bdbc9026a5668e11362178e10ab7400c8:gigpo/core_gigpo.py: `compute_gigpo_outcome_advantage`
    (combination), `episode_norm_reward` (episode level; single-row group → μ 0, σ 1), `build_step_group` (exact
    match of `to_hashable(anchor_obs)` inside each `index` group; `enable_similarity=False` default),
    `step_norm_reward` (single-member step group → advantage 0), `compute_step_discounted_returns` (γ; recipe
    `algorithm.gamma=0.95`). Defaults: `step_advantage_w=1.0`, `mode="mean_std_norm"`.

    Choices:
        * `gigpo_episode_stats="trajectory"` (default, paper Eq. 3): each episode counts once in the episode-level
          statistics. `"steps"` reproduces the official default `compute_mean_std_cross_steps=True`, where the
          statistics run over step rows (long episodes weigh more); with it our numbers equal the official code's.
        * Deliberate differences from the official code: an episode group with fewer than 2 scored entries gives
          0 (official: μ 0, σ 1, i.e. the raw reward); a group whose values are all equal gives exactly 0;
          similarity-based grouping (`enable_similarity=True`) is not implemented (anchor keys are exact hashes,
          `step_credit.state_key`); the invalid-action penalty (0.1 in the recipes) is reward shaping and belongs
          in the environment's step rewards.
        * Step rewards `r_t` come from the environment (`StepBatch.reward`); the episode outcome `R_e` is the
          trainer's reward (in verl-agent it is the sum of the step rewards; the two can be made equal by the
          environment, as the toy counter game does).
        * NaN episode reward: the episode is left out of every statistic (both levels) and all its steps get 0. A
          NaN step reward makes that step's (and every earlier step's) return NaN: those steps are left out of
          the step groups and get `A^S = 0`. ±inf raises.

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` episode outcomes, `N/G` contiguous groups of `G`.
        group_size (`int`): `G`.
        steps (`StepBatch`): the `S` steps (episode, index, anchor-state key, step reward).

    Returns:
        `torch.Tensor`: `(S,)` per-step advantages.
    """
    flag = "advantage_estimator='gigpo'"
    check_steps(episode_rewards, group_size, steps, flag)
    if gigpo_mode not in GIGPO_MODES:
        raise ValueError(f"gigpo_mode must be one of {GIGPO_MODES}, got {gigpo_mode!r}.")
    if gigpo_episode_stats not in GIGPO_EPISODE_STATS:
        raise ValueError(f"gigpo_episode_stats must be one of {GIGPO_EPISODE_STATS}, got {gigpo_episode_stats!r}.")
    if not 0.0 <= gigpo_gamma <= 1.0:
        raise ValueError(f"gigpo_gamma must lie in [0, 1], got {gigpo_gamma}.")
    scale = gigpo_mode == "mean_std_norm"
    n = episode_rewards.shape[0]
    valid_ep = ~torch.isnan(episode_rewards)

    ep_adv = episode_advantages(episode_rewards, group_size, steps, stats=gigpo_episode_stats, scale=scale,
                                unbiased=True, eps=VERL_EPS)

    returns = discounted_returns(steps, n, gigpo_gamma)
    step_valid = valid_ep[steps.episode] & ~torch.isnan(returns)
    # anchor-state group = (prompt group, exact state key); torch.unique over the pair gives the group ids
    pair = torch.stack([steps.episode // group_size, steps.state], dim=1)
    if pair.numel():
        _, segments = torch.unique(pair, dim=0, return_inverse=True)
    else:
        segments = torch.zeros(0, dtype=torch.long)
    step_adv, _ = segment_normalize(returns, segments, step_valid, scale=scale, unbiased=True, eps=VERL_EPS)

    adv = ep_adv + gigpo_step_advantage_w * step_adv
    return torch.where(valid_ep[steps.episode], adv, torch.zeros_like(adv)).to(torch.float32)
