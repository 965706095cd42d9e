"""CCPO (Collaborative / Counterfactual Credit Policy Optimization): counterfactual credit for one agent of a
two-agent pipeline (catalog id `ccpo`, issue 8; arXiv:2603.21563).

Dispatched with `advantage_estimator="ccpo"` (requires `step_structure`, `step_modules` and
`counterfactual_rewards`: the trainer supplies `steps` with the agent of each turn in `StepBatch.module`, and the
reward of each episode's counterfactual run scored by the run's own reward functions; see `trl_groupx.contracts`
and `trl_groupx/toy/two_agent_rollout.py`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import VERL_EPS, StepBatch, check_steps, segment_normalize, state_key

CCPO_CREDITS = ("event", "delta", "marginal")
CCPO_SOLO_BASELINES = ("group", "row")
CCPO_OUTCOMES = ("sign", "raw")
_FLAG = "advantage_estimator='ccpo'"


def _validate(config) -> None:
    if config.ccpo_credit not in CCPO_CREDITS:
        raise ValueError(f"ccpo_credit must be one of {CCPO_CREDITS}, got {config.ccpo_credit!r}; 'event' is the "
                         "official default, 'marginal' the abstract's R(team) - R(team without the agent).")
    if config.ccpo_solo_baseline not in CCPO_SOLO_BASELINES:
        raise ValueError(f"ccpo_solo_baseline must be one of {CCPO_SOLO_BASELINES}, got "
                         f"{config.ccpo_solo_baseline!r}; 'group' is the official default.")
    if config.ccpo_outcome not in CCPO_OUTCOMES:
        raise ValueError(f"ccpo_outcome must be one of {CCPO_OUTCOMES}, got {config.ccpo_outcome!r}; 'sign' is the "
                         "official verifier outcome (+1 if reward > 0 else -1).")
    if not config.ccpo_lambda >= 0.0:  # also refuses NaN
        raise ValueError(f"ccpo_lambda must be >= 0 (official 0.2), got {config.ccpo_lambda}.")
    if not isinstance(config.ccpo_credited_agent, str) or not config.ccpo_credited_agent:
        raise ValueError("ccpo_credited_agent must name the agent (the `step_modules` label your rollout_func writes "
                         f"on its turns) that gets the counterfactual credit, got {config.ccpo_credited_agent!r}.")


def credited_agent_keys(name: str) -> torch.Tensor:
    """The `StepBatch.module` keys a turn of agent `name` can carry: `StepBatch.from_lists` hashes the name once
    (`state_key(name)`); the trainer hashes it before gathering across processes and `from_lists` hashes that key
    again."""
    key = state_key(name)
    return torch.tensor([key, state_key(key)], dtype=torch.long)


def verifier_outcome(rewards: torch.Tensor, mode: str) -> torch.Tensor:
    """`"sign"`: +1 where the reward is > 0, −1 elsewhere (the official verifier outcome, so a 0/1 verifier gives
    ±1); `"raw"`: the rewards unchanged. NaN (unscored) stays NaN in both."""
    r = rewards.double()
    if mode == "raw":
        return r
    return torch.where(torch.isnan(r), r, torch.where(r > 0, 1.0, -1.0).double())


def counterfactual_role_rewards(
    team_rewards: torch.Tensor,
    counterfactual_rewards: torch.Tensor,
    group_size: int,
    *,
    ccpo_lambda: float = 0.2,
    ccpo_credit: str = "event",
    ccpo_solo_baseline: str = "group",
    ccpo_outcome: str = "sign",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(N,)` rewards of the credited agent and of the other agent(s), float64, NaN where the team outcome is
    unscored (and, for `"marginal"`, where the counterfactual baseline is). Formulas in `ccpo_step_advantages`."""
    o = verifier_outcome(team_rewards, ccpo_outcome)
    solo = verifier_outcome(counterfactual_rewards, ccpo_outcome)
    if ccpo_solo_baseline == "group":  # mean of the scored counterfactual outcomes of the episode's prompt group
        groups = torch.arange(o.numel()) // group_size
        scored = ~torch.isnan(solo)
        count = torch.zeros(o.numel() // group_size, dtype=torch.float64).index_add_(0, groups, scored.double())
        total = torch.zeros_like(count).index_add_(0, groups, torch.where(scored, solo, 0.0))
        baseline = torch.where(count > 0, total / count.clamp(min=1), torch.nan)[groups]
    else:
        baseline = solo
    if ccpo_credit == "marginal":
        return o - baseline, o
    if ccpo_credit == "event":
        helped = (o > 0) & (baseline < 0)  # comparisons with NaN are False: no event without a counterfactual
        hurt = (o < 0) & (baseline > 0)
        bonus = helped.double() - hurt.double()
    else:
        bonus = torch.nan_to_num((o - baseline) * 0.5, nan=0.0)
    return o + ccpo_lambda * bonus, o


@register(
    "ccpo",
    name="CCPO (Collaborative Credit Policy Optimization): counterfactual credit for one agent of a team",
    paper="Counterfactual Credit Policy Optimization for Multi-Agent Collaboration, arXiv:2603.21563",
    official_code="bhai114/ccpo@ea50d3ae4f6f08affb6528b69b6f40f3493bb0c9:"
                  "CCPO/examples/gspo_trainer/two_model/two_model_trainer.py",
    stage="advantages",
    # the official runs: GSPO's sequence ratio with clip 3e-4 / 4e-4, no KL (run_qwen2_5_1_5b_gspo_two_model.sh),
    # token-mean aggregation (verl actor.yaml loss_agg_mode, = TRL's "dapo" normaliser)
    flags={"advantage_estimator": "ccpo", "loss_type": "dapo", "importance_sampling_level": "sequence",
           "epsilon": 3e-4, "epsilon_high": 4e-4, "beta": 0.0},
    requires=("step_structure", "step_modules", "counterfactual_rewards"),
    needs=("a two-agent rollout_func returning per episode `step_modules` (the agent of each turn) and "
           "`counterfactual_completion_ids` (the pipeline's output without the credited agent); see "
           "trl_groupx/toy/two_agent_rollout.py",),
    params=("ccpo_lambda", "ccpo_credit", "ccpo_solo_baseline", "ccpo_outcome", "ccpo_scale", "ccpo_credited_agent"),
    validate=_validate,
)
def ccpo_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    counterfactual_rewards: torch.Tensor,
    ccpo_lambda: float = 0.2,
    ccpo_credit: str = "event",
    ccpo_solo_baseline: str = "group",
    ccpo_outcome: str = "sign",
    ccpo_scale: bool = False,
    ccpo_credited_agent: str = "thinker",
) -> torch.Tensor:
    """CCPO per-turn advantages: the team outcome turned into one reward per agent, then a group baseline per agent.

    Setting (the official Think–Solve pipeline): per prompt, `G` episodes; in episode `e` agent 1 (the credited
    agent, the Thinker) acts, then agent 2 (the Solver) produces the team's output, whose reward is `R_e`. The
    counterfactual run of `e` is the pipeline without agent 1 (the Solver alone on the prompt), with reward `R̃_e`,
    scored by the same reward functions. With `o(·)` the verifier outcome (`ccpo_outcome="sign"`: +1 if the reward
    is > 0 else −1),

        b_e      = mean_{e' ∈ g(e), R̃ scored} o(R̃_e')   ("group", official)   or   o(R̃_e)   ("row")
        bonus_e  = 1[o(R_e) > 0 ∧ b_e < 0] − 1[o(R_e) < 0 ∧ b_e > 0]     ("event", official default)
                 = (o(R_e) − b_e) / 2                                     ("delta", official use_event_bonus=False)
        r¹_e     = o(R_e) + λ · bonus_e,   λ = 0.2                        credited agent (Thinker)
        r¹_e     = o(R_e) − b_e                                           ("marginal": the abstract's credit)
        r²_e     = o(R_e)                                                 every other agent (Solver)
        A^k_e    = r^k_e − mean_{g(e)} r^k      (/ (std_{g(e)} r^k + 1e-6) with `ccpo_scale=True`)

    and every turn of `e` made by agent `k` gets `A^k_e`. The abstract ("comparing the realized team outcome with a
    counterfactual outcome where that agent is removed") is `ccpo_credit="marginal"` with
    `ccpo_solo_baseline="row"` and `ccpo_outcome="raw"`: r¹_e = R_e − R̃_e exactly.

    Official code: bhai114/ccpo@ea50d3ae4f6f08affb6528b69b6f40f3493bb0c9:
    CCPO/examples/gspo_trainer/two_model/two_model_trainer.py:
        * `_compute_counterfactual_role_rewards` (l.1065–1105): solo baseline = `_group_mean` (l.181–203) of the solo
          outcomes over `two_model_prompt_uid` when `counterfactual_use_group_solo_baseline` (default True), helped /
          hurt events, bonus `helped − hurt` (or `(r_joint − baseline)·0.5` when `counterfactual_use_event_bonus` is
          False), `r1 = r_joint + counterfactual_lambda·bonus` for the Thinker, `r2 = r_joint` for the Solver;
        * `_verifier_outcome_from_reward` (l.1028–1063): `where(raw > 0, +1, −1)` of the verifier score;
        * `_two_stage_rollout` / `_build_solver_solo_inputs` (l.868–999): the counterfactual is a Solver-only run per
          rollout on the bare problem ("without the Thinker"); there is no run without the Solver;
        * `fit` (l.1198–1283): the role's scalar reward on its own tokens, `_compute_grpo_like_advantage` (l.206–225,
          verl `compute_grpo_outcome_advantage`, groups = prompt uid) with `norm_adv_by_std_in_grpo=False` from
          examples/gspo_trainer/run_qwen2_5_1_5b_gspo_two_model.sh (l.62–65; λ = 0.2 there too; robust mean off, l.18).

    Choices:
        * One shared policy: both agents are the policy under different role prompts, and every turn of both trains
          in each step. The official code trains two separate models and alternates which one updates every
          `alternate_period` = 10 steps; with one policy that would only drop half of each batch.
        * `ccpo_outcome="sign"` (official) maps every reward, shaping included, to ±1 by its sign, as the official
          code maps the verifier score; `"raw"` keeps the run's rewards, for which the events need rewards signed
          around 0 (with a 0/1 reward no episode is ever "hurt" or "helped").
        * The credited agent is named by `ccpo_credited_agent` (the `step_modules` label of its turns, official: the
          Thinker); turns of any other label get the team advantage. Only one agent has a counterfactual, as in the
          official code ("without the Solver" has no answer to score).
        * Group statistics per agent run over the scored episodes of the prompt group, each once, including
          episodes in which that agent never acted (its reward is defined per episode; such an episode has no turn
          of that agent to train). NaN team reward: excluded, its turns get 0. NaN counterfactual: left out of the
          group solo baseline; a baseline with no scored counterfactual gives bonus 0 (`"event"`, `"delta"`) or an
          unscored credited reward (`"marginal"`: excluded, its credited turns get 0). ±inf raises.
        * A group with fewer than 2 scored episodes gives 0 (verl gives the raw reward for a one-row group); a group
          whose rewards are all equal gives exactly 0.
        * The paper's second allocator (verifier-anchored LLM self/peer evaluation, the official repository's
          separate SEPO/ recipe, where both roles write a rating JSON after the verifier) is not implemented: it
          needs extra LLM calls by each role, not a reward callable, and the counterfactual trainer does not use it.

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` team rewards `R` (the run's weighted reward sum), `N/G` contiguous
            groups of `G`; NaN = unscored.
        group_size (`int`): `G`.
        steps (`StepBatch`): the `S` turns; `steps.module` (`(S,)`, `state_key` of the agent name) must be set.
        counterfactual_rewards (`torch.Tensor`): `(N,)` rewards `R̃` of each episode's run without the credited agent.

    Returns:
        `torch.Tensor`: `(S,)` float32 per-turn advantages.
    """
    check_steps(episode_rewards, group_size, steps, _FLAG)
    n = episode_rewards.numel()
    if steps.module is None:
        raise ValueError(f"{_FLAG} needs the agent of each turn: return `step_modules` (one agent name per turn, "
                         "e.g. 'thinker' / 'solver') from your rollout_func (see toy/two_agent_rollout.py).")
    if steps.module.shape != steps.episode.shape:
        raise ValueError(f"{_FLAG}: StepBatch.module must be ({steps.num_steps},), got {tuple(steps.module.shape)}.")
    if counterfactual_rewards.shape != (n,):
        raise ValueError(f"{_FLAG}: counterfactual_rewards must be ({n},), got {tuple(counterfactual_rewards.shape)}.")
    if torch.isinf(counterfactual_rewards).any():
        raise ValueError(f"{_FLAG}: infinite counterfactual reward; the reward functions must return finite values "
                         "(NaN marks an unscored run).")
    credited = torch.isin(steps.module, credited_agent_keys(ccpo_credited_agent))
    if steps.num_steps and not credited.any():
        raise ValueError(f"{_FLAG}: no turn of this batch is labelled ccpo_credited_agent={ccpo_credited_agent!r}; "
                         "set it to the `step_modules` name your rollout_func gives the agent to credit.")
    r_credited, r_team = counterfactual_role_rewards(
        episode_rewards.cpu(), counterfactual_rewards.cpu(), group_size, ccpo_lambda=ccpo_lambda,
        ccpo_credit=ccpo_credit, ccpo_solo_baseline=ccpo_solo_baseline, ccpo_outcome=ccpo_outcome)
    groups = torch.arange(n) // group_size
    adv = []
    for r in (r_credited, r_team):
        a, _ = segment_normalize(r, groups, ~torch.isnan(r), scale=ccpo_scale, unbiased=True, eps=VERL_EPS)
        adv.append(a)
    return torch.where(credited, adv[0][steps.episode], adv[1][steps.episode]).to(torch.float32)
