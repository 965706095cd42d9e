"""GAGPO (Generalized Advantage Grouped Policy Optimization): a non-parametric grouped state value from the sampled
rollouts and GAE-style step advantages, normalised per group (catalog family Q, issue 8).

Dispatched with `advantage_estimator="gagpo"` (requires `step_structure`: the trainer supplies `steps`, see
`trl_groupx.contracts`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import VERL_EPS, StepBatch, check_steps, dense_by_episode, discounted_returns, segment_normalize

GAGPO_NORMS = ("mean_std", "mean", "none")
GAGPO_REWARD_SOURCES = ("outcome", "steps")


def _check_settings(gamma: float, lam: float, norm: str, reward_source: str) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gagpo_gamma must lie in [0, 1], got {gamma}.")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"gagpo_lambda must lie in [0, 1] (1: Monte-Carlo return − V, 0: TD(0) residual), got {lam}.")
    if norm not in GAGPO_NORMS:
        raise ValueError(f"gagpo_norm must be one of {GAGPO_NORMS}, got {norm!r}.")
    if reward_source not in GAGPO_REWARD_SOURCES:
        raise ValueError(f"gagpo_reward_source must be one of {GAGPO_REWARD_SOURCES}, got {reward_source!r}.")


def _validate(config) -> None:
    _check_settings(config.gagpo_gamma, config.gagpo_lambda, config.gagpo_norm, config.gagpo_reward_source)


def grouped_state_values(returns: torch.Tensor, segments: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`(S,)` value proxy `V(s_t)`: the mean of the `valid` returns of the steps in the same segment (prompt group and
    state) as step `t`, NaN where the segment has no valid return. Float64."""
    v = torch.where(valid, returns.double(), torch.zeros((), dtype=torch.float64))
    m = int(segments.max()) + 1 if segments.numel() else 0
    total = torch.zeros(m, dtype=torch.float64).scatter_add_(0, segments, v)
    count = torch.zeros(m, dtype=torch.float64).scatter_add_(0, segments, valid.double())
    mean = torch.where(count > 0, total / count.clamp(min=1.0), torch.full_like(total, float("nan")))
    return mean[segments]


@register(
    "gagpo",
    name="GAGPO (Generalized Advantage Grouped Policy Optimization)",
    paper="Generalized Advantage Grouped Policy Optimization, arXiv:2605.13217",
    official_code=None,
    stage="advantages",
    # the abstract's action-level importance ratio: one ratio per turn (objective/turn_ratio.py), in verl's PPO loss
    flags={"advantage_estimator": "gagpo", "importance_sampling_level": "turn", "loss_type": "dual_clip"},
    requires=("step_structure",),
    needs=("multi-turn rollouts with comparable states: rollout_func fields step_states/step_rewards or an "
           "environment with _step_structure()",),
    params=("gagpo_gamma", "gagpo_lambda", "gagpo_norm", "gagpo_reward_source"),
    validate=_validate,
)
def gagpo_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    gagpo_gamma: float = 0.95,
    gagpo_lambda: float = 0.95,
    gagpo_norm: str = "mean_std",
    gagpo_reward_source: str = "outcome",
) -> torch.Tensor:
    """GAGPO per-step advantages:

        r_t      = R_e on the episode's last step, 0 before  (`gagpo_reward_source="steps"`: the step rewards)
        G_t      = Σ_{k ≥ 0} γ^k r_{t+k}                                            discounted return
        V(s)     = mean_{U_g(s)} G                U_g(s) = steps of prompt group g acting on state s (incl. t)
        δ_t      = r_t + γ·V(s_{t+1}) − V(s_t)    V(s_{T}) = 0 after the episode's last step
        Â_t      = Σ_{k ≥ 0} (γλ)^k δ_{t+k}                                         GAE, inside the episode
        A_t      = (Â_t − mean_g Â) / (std_g Â + ε)                                 over the steps of group g

    Checks: λ = 1 telescopes to `Â_t = G_t − V(s_t)` (Monte-Carlo return minus the grouped value, for any γ);
    λ = 0 gives the TD(0) residual `Â_t = δ_t`. std is unbiased, ε = 1e-6.

    Paper: arXiv:2605.13217 (abstract only; no official code is public). The abstract states: a non-parametric
    grouped value proxy from the sampled rollouts, TD/GAE-style temporal advantages propagating the outcome backward
    through time, group-wise advantage normalisation, and an action-level importance ratio. Everything else is ours:

    Choices:
        * Value proxy: the mean discounted return of the group's steps at the same exact state (GiGPO's anchor-state
          groups, `step_credit.state_key`), the step itself included, so a state seen once has `V = G_t` (and,
          with λ = 1, `Â_t = 0`: nothing to compare against).
        * Rewards: `"outcome"` (default) places the trainer's episode reward `R_e` on the last step (the sparse
          trajectory-level reward the abstract targets); `"steps"` uses the environment's step rewards
          (`StepBatch.reward`), as `gigpo` does.
        * Terminal value: `V = 0` after an episode's last step (no bootstrapping past the end, also for episodes
          cut off by a turn limit).
        * γ = 0.95 (verl-agent's ALFWorld / WebShop recipes, the benchmarks the paper reports on) and λ = 0.95 (the
          usual GAE value); the paper's values are not in the abstract.
        * Normalisation: `"mean_std"` (default) over all valid steps of the prompt group, as GRPO normalises over
          its group; `"mean"` only subtracts the mean; `"none"` returns `Â`. A group with fewer than 2 valid steps
          or with all-equal `Â` gives 0 (except `"none"`).
        * Action-level importance ratio: an objective setting, not this stage's output. The registry flags set
          `importance_sampling_level="turn"`: one ratio per turn, `ρ_a = exp(mean_{t ∈ a}(log π_θ − log π_old))`,
          shared and clipped by the turn's tokens (`trl_groupx.objective.turn_ratio`; the length normalisation is
          our choice, the abstract gives no formula), with `loss_type="dual_clip"` (Choice: verl's PPO loss, the
          default of verl-agent, which implements GiGPO, a baseline the paper compares against on ALFWorld /
          WebShop; its cap `dual_clip_c = 3` acts only on negative advantages with ρ > 3; the paper's clip values
          are not in the abstract, so ε = 0.2 is verl's). Every
          token of a turn carries that turn's advantage, so on-policy (ρ = 1) the turn ratio gives the per-token
          ratio's gradient. `advantage_estimator="gagpo"` alone keeps the run's own objective and ratio level.
        * NaN episode reward: the episode is left out of the value proxy and the normalisation and its steps get 0.
          A NaN step reward (`"steps"`) makes the returns, δ and advantages of that step and every earlier step of
          its episode NaN: they are left out and get 0. ±inf raises.

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` episode outcomes, `N/G` contiguous groups of `G`.
        group_size (`int`): `G`.
        steps (`StepBatch`): the `S` steps (episode, index, state key, step reward).

    Returns:
        `torch.Tensor`: `(S,)` per-step advantages.
    """
    flag = "advantage_estimator='gagpo'"
    check_steps(episode_rewards, group_size, steps, flag)
    _check_settings(gagpo_gamma, gagpo_lambda, gagpo_norm, gagpo_reward_source)
    n = episode_rewards.shape[0]
    s = steps.num_steps
    if s == 0:
        return torch.zeros(0)
    valid_ep = ~torch.isnan(episode_rewards)

    rank_dense, rank = dense_by_episode(torch.ones(s, dtype=torch.long), steps, n, fill=0)
    length = rank_dense.sum(dim=1)
    is_last = rank == length[steps.episode] - 1
    if gagpo_reward_source == "outcome":
        outcome = episode_rewards.double()[steps.episode]
        reward = torch.where(is_last, outcome, torch.zeros_like(outcome))
    else:
        reward = steps.reward.double()
    returns = discounted_returns(StepBatch(steps.episode, steps.index, steps.state, reward), n, gagpo_gamma).double()

    group = steps.episode // group_size
    _, segments = torch.unique(torch.stack([group, steps.state], dim=1), dim=0, return_inverse=True)
    value = grouped_state_values(returns, segments, valid_ep[steps.episode] & ~torch.isnan(returns))

    value_dense, _ = dense_by_episode(value, steps, n, fill=0.0)
    next_value = torch.nn.functional.pad(value_dense[:, 1:], (0, 1))[steps.episode, rank]
    next_value = torch.where(is_last, torch.zeros_like(next_value), next_value)
    delta = reward + gagpo_gamma * next_value - value

    delta_dense, _ = dense_by_episode(delta, steps, n, fill=0.0)
    gae = torch.zeros_like(delta_dense)
    running = torch.zeros(n, dtype=torch.float64)
    for t in range(delta_dense.shape[1] - 1, -1, -1):  # padding past an episode's end holds δ = 0
        running = delta_dense[:, t] + gagpo_gamma * gagpo_lambda * running
        gae[:, t] = running
    adv = gae[steps.episode, rank]

    valid = valid_ep[steps.episode] & ~torch.isnan(adv)
    if gagpo_norm != "none":
        adv, _ = segment_normalize(adv, group, valid, scale=gagpo_norm == "mean_std", unbiased=True, eps=VERL_EPS)
    return torch.where(valid, adv, torch.zeros_like(adv)).to(torch.float32)
