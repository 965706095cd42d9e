"""Flow-GRPO (AgentFlow): the trajectory outcome broadcast to every turn (arXiv:2510.05592).

Dispatched with `advantage_estimator="agentflow"` (requires `step_structure`: the trainer supplies `steps`, see
`trl_groupx.contracts`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import VERL_EPS, StepBatch, check_steps, episode_advantages

AGENTFLOW_EPISODE_STATS = ("trajectory", "steps")


def _validate(config) -> None:
    if config.agentflow_episode_stats not in AGENTFLOW_EPISODE_STATS:
        raise ValueError(f"agentflow_episode_stats must be one of {AGENTFLOW_EPISODE_STATS}, got "
                         f"{config.agentflow_episode_stats!r}.")


@register(
    "agentflow",
    name="Flow-GRPO (AgentFlow): trajectory outcome broadcast to every turn",
    paper="In-the-Flow Agentic System Optimization for Effective Planning and Tool Use (AgentFlow), arXiv:2510.05592",
    official_code="lupantech/AgentFlow@b94006436b8712ab8682846fb0d886a5f174f2d4:agentflow/verl/daemon.py",
    stage="advantages",
    requires=("step_structure",),
    needs=("multi-turn rollouts with a step record: rollout_func fields step_states/step_rewards or an environment "
           "with _step_structure()",),
    params=("agentflow_episode_stats", "agentflow_scale"),
    validate=_validate,
)
def agentflow_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    agentflow_episode_stats: str = "trajectory",
    agentflow_scale: bool = True,
) -> torch.Tensor:
    """Flow-GRPO per-step advantages: every turn of episode `e` gets its episode's group-relative outcome advantage

        A_{e,t} = (R_e − mean_g R) / (std_g R + ε),   for all turns t of e,   ε = 1e-6,

    with `g` the `G` episodes of the same query (Flow-GRPO Eq. 5–6: "broadcast one verifiable trajectory outcome to
    every turn"; group-normalised over the trajectories of a query).

    Official code: lupantech/AgentFlow@b94006436b8712ab8682846fb0d886a5f174f2d4:agentflow/verl/daemon.py:
    `AgentModeDaemon.get_train_data_batch` (l.650–733: one row per turn, each row's score is the trajectory's final
    reward, `uid = data_id` in agentflow/verl/trainer.py l.208), then verl (8fdc4d3f202f41461f4de9f42a637228e342668b)
    `core_algos.compute_grpo_outcome_advantage`: per-uid mean and unbiased `torch.std` over ROWS, `(s − μ)/(σ + 1e-6)`,
    a one-row group gets μ = 0, σ = 1.

    Choices:
        * `agentflow_episode_stats="trajectory"` (default, the paper's formula): each scored episode counts once in
          the group statistics. `"steps"` reproduces the official code, whose statistics run over turn rows, so an
          episode with 3 turns weighs 3× one with 1 turn (`step_credit.episode_advantages`).
        * Deliberate differences from the official code: the reward is not rounded to bfloat16 (the daemon builds
          `scores` in bf16); a group with fewer than 2 scored entries gives 0 (verl gives the raw reward for a
          one-row group); a group whose scored rewards are all equal gives exactly 0.
        * `agentflow_scale=False` drops the std division (verl `norm_adv_by_std_in_grpo=False`).
        * NaN episode reward (unscored): excluded from the statistics, every step gets 0. ±inf raises.

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` trajectory outcomes, `N/G` contiguous groups of `G`.
        group_size (`int`): `G`.
        steps (`StepBatch`): the turns of the `N` episodes (only `episode` is read; `"steps"` also counts them).

    Returns:
        `torch.Tensor`: `(S,)` per-step advantages, constant over the steps of an episode.
    """
    flag = "advantage_estimator='agentflow'"
    check_steps(episode_rewards, group_size, steps, flag)
    if agentflow_episode_stats not in AGENTFLOW_EPISODE_STATS:
        raise ValueError(f"agentflow_episode_stats must be one of {AGENTFLOW_EPISODE_STATS}, got "
                         f"{agentflow_episode_stats!r}.")
    adv = episode_advantages(episode_rewards, group_size, steps, stats=agentflow_episode_stats,
                             scale=agentflow_scale, unbiased=True, eps=VERL_EPS)
    return adv.to(torch.float32)
