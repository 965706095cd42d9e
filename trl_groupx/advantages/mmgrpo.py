"""mmGRPO (multi-module GRPO, `dspy.GRPO`): the LM calls of a program grouped by module across the program's rollouts
(arXiv:2508.04660).

Dispatched with `advantage_estimator="mmgrpo"` (requires `step_structure` and `step_modules`: the trainer supplies
`steps` with `StepBatch.module`, see `trl_groupx.contracts`). One step of an episode is one LM call of the program,
labelled with the module that made it (a rollout_func's `step_modules` field, e.g.
`trl_groupx/toy/two_module_program.py`).
"""

from __future__ import annotations

import torch

from ..registry import register
from .step_credit import StepBatch, check_steps, segment_normalize, step_rank

MMGRPO_GROUPINGS = ("truncate", "ragged")
# Arbor's `_compute_advantages`: advantages / (std + 1e-4) when `scale_rewards` is on.
ARBOR_STD_EPS = 1e-4


def _validate(config) -> None:
    if config.mmgrpo_grouping not in MMGRPO_GROUPINGS:
        raise ValueError(f"mmgrpo_grouping must be one of {MMGRPO_GROUPINGS}, got {config.mmgrpo_grouping!r}; "
                         "'truncate' is dspy's default ('fill' is not implemented).")


def module_call_rank(steps: StepBatch) -> torch.Tensor:
    """`(S,)` j of each step: how many earlier calls (by `StepBatch.index`) its episode made to the same module."""
    pairs = torch.stack([steps.episode, steps.module], dim=1)
    _, pair_id = torch.unique(pairs, dim=0, return_inverse=True)
    return step_rank(StepBatch(pair_id, steps.index, steps.state, steps.reward))


def _truncated_lengths(steps: StepBatch, valid_ep: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(S,)` dspy's `min_len` for each step's (prompt group, module): the fewest calls of the module made by a
    scored rollout of the prompt, 0 when some scored rollout never called it."""
    n = valid_ep.numel()
    step_valid = valid_ep[steps.episode]
    pairs = torch.stack([steps.episode, steps.module], dim=1)[step_valid]
    if pairs.numel() == 0:
        return torch.zeros(steps.num_steps, dtype=torch.long)
    (ep_mod, calls) = torch.unique(pairs, dim=0, return_counts=True)  # one row per (scored episode, module) pair
    gm = torch.stack([ep_mod[:, 0] // group_size, ep_mod[:, 1]], dim=1)
    gm_keys, gm_id = torch.unique(gm, dim=0, return_inverse=True)
    big = torch.iinfo(torch.long).max
    min_calls = torch.full((gm_keys.shape[0],), big, dtype=torch.long).scatter_reduce_(0, gm_id, calls, "amin")
    callers = torch.zeros(gm_keys.shape[0], dtype=torch.long).scatter_add_(0, gm_id, torch.ones_like(gm_id))
    scored_per_group = torch.bincount(torch.arange(n)[valid_ep] // group_size, minlength=n // group_size)
    length = torch.where(callers == scored_per_group[gm_keys[:, 0]], min_calls, torch.zeros_like(min_calls))
    # look each step's (prompt group, module) up among the scored pairs' keys
    step_gm = torch.stack([steps.episode // group_size, steps.module], dim=1)
    match = (step_gm[:, None, :] == gm_keys[None, :, :]).all(-1)
    found = match.any(1)
    return torch.where(found, length[match.float().argmax(1)], torch.zeros_like(steps.episode))


@register(
    "mmgrpo",
    name="mmGRPO (multi-module GRPO): LM calls grouped by module across program rollouts",
    paper="Multi-module GRPO: Composing Policy Gradients and Prompt Optimization for Language Model Programs, "
          "arXiv:2508.04660",
    official_code="stanfordnlp/dspy@4ed377ee9110e912d4f5e1be43b317b87455053c:dspy/teleprompt/grpo.py",
    stage="advantages",
    flags={"advantage_estimator": "mmgrpo", "loss_type": "dr_grpo", "beta": 0.001, "epsilon_high": 0.28},
    requires=("step_structure", "step_modules"),
    needs=("a program rollout_func returning `step_modules` (the module name of each LM call) per episode; see "
           "trl_groupx/toy/two_module_program.py",),
    params=("mmgrpo_grouping", "mmgrpo_scale"),
    validate=_validate,
)
def mmgrpo_step_advantages(
    episode_rewards: torch.Tensor,
    group_size: int,
    steps: StepBatch,
    *,
    mmgrpo_grouping: str = "truncate",
    mmgrpo_scale: bool = False,
) -> torch.Tensor:
    """mmGRPO per-call advantages: the j-th call of module m in rollout e is compared with the j-th calls of m in the
    other rollouts of the same program input, all scored by the program-level reward:

        U(g, m, j) = {rollouts e of prompt group g that make a j-th call of module m}   (g = e // G)
        A_{e,m,j}  = R_e − mean_{U(g,m,j)} R                  (mmgrpo_scale=False, Arbor's default)
        A_{e,m,j}  = (R_e − mean_U R) / (std_U R + 1e-4)      (mmgrpo_scale=True; unbiased std)

    with `R_e` the program score (the trainer's episode reward). `mmgrpo_grouping` decides which calls are trained
    when the rollouts of a prompt call a module different numbers of times (variable-length or interrupted
    programs), with `L(g, m) = min_{e ∈ g} c_{e,m}` the fewest calls of m among the group's scored rollouts:

        "truncate" (dspy default): calls with j < L(g, m) form groups of all scored rollouts; calls with
                   j ≥ L(g, m) get 0, and a module some scored rollout never called (L = 0) gets 0 for the prompt.
        "ragged":  every call is trained; U(g, m, j) holds only the rollouts that made a j-th call of m.

    Official code: stanfordnlp/dspy@4ed377ee9110e912d4f5e1be43b317b87455053c:dspy/teleprompt/grpo.py `GRPO.compile`
    l.408–508: per predictor and per example, each rollout's calls of that predictor in trace order (l.423), every
    call carrying the rollout's program score (l.423, l.459); `min_len == 0` skips the example for that predictor
    (l.433–437); `truncate` cuts every rollout to `min_len` calls (l.439–440); group j is the j-th call of every
    rollout (l.454–458); a call whose parse failed scores `format_reward or format_failure_score` (l.478–479), the
    same number `bootstrap_trace_data` gives the whole program (dspy/teleprompt/bootstrap_trace.py l.54–58), and
    the program stops at that call (l.85–110: the interrupted trajectory keeps its earlier calls and the failed
    one). Defaults `variably_invoked_predictor_grouping_mode="truncate"`, `format_failure_score=-1` (l.42–44).
    l.540–547: a group with fewer than G entries is padded by repeating its first entries. Advantages:
    Ziems/arbor@2c1b9041b330113e831a9dcf897e5126fc4259a5:arbor/training/grpo/trainer.py `_compute_advantages`
    (l.1213–1230: per group of `num_generations` rows, `r − mean`, divided by unbiased `std + 1e-4` only when
    `scale_rewards`), `compute_loss` (l.1232–1307, `dr_grpo`: token sum / (rows × max_seq_len)); defaults in
    arbor/training/grpo/config.py: `scale_rewards=False` (l.328), `loss_type="dr_grpo"` (l.341), `beta=0.001`
    (l.288), `epsilon=0.2` (l.301), `epsilon_high=0.28` (l.311), `learning_rate=1e-6` (l.281; TRL's default too).
    The registered flags set `loss_type="dr_grpo"`, `beta=0.001`, `epsilon_high=0.28`.

    Choices:
        * The official `ragged` mode crashes when rollouts call a module different numbers of times (l.458 indexes
          a rollout's calls past their end); our `"ragged"` is what that mode's groups mean (the catalog's
          "variable-length/interrupted trajectories"). `"fill"` (repeat a rollout's last or a random call up to
          the longest) is not implemented: a repeated call would need two advantages on the same tokens.
        * Format failures: the run's reward functions score the program (the toy program returns dspy's −1 for an
          interrupted one); this function does not rescore calls.
        * Deliberate differences from the official code: a NaN program reward (unscored rollout) is left out of
          every group, of `L(g, m)`, and gets 0 (dspy instead drops a rollout it could not run and pads the short
          groups by repeating their first entries, l.540–547, which counts those twice); groups of fewer than 2
          scored calls get 0 (they cannot arise in the official code, whose groups always hold G entries after that
          padding); all-equal groups give exactly 0.
        * Layout: in dspy/Arbor each call is its own training row (its module's prompt, its completion); here the
          calls of one rollout are the turns of one TRL row (the tokens between them masked by `tool_mask`), each
          turn's tokens carrying its call's advantage. Calls that `"truncate"` leaves out keep advantage 0 rather
          than leaving the batch: they add no policy gradient but still count in the loss normaliser and carry the
          KL term when β > 0; `dr_grpo` divides by (episodes × max_completion_length) rather than (calls ×
          max_seq_len).
        * Statistics in float64; ±inf raises.

    Args:
        episode_rewards (`torch.Tensor`): `(N,)` program scores, `N/G` contiguous groups of `G` (one program input).
        group_size (`int`): `G`.
        steps (`StepBatch`): the `S` LM calls; `module` (required) names the module of each, `index` orders the
            calls of an episode (states and step rewards are not read).

    Returns:
        `torch.Tensor`: `(S,)` float32 per-call advantages.
    """
    flag = "advantage_estimator='mmgrpo'"
    check_steps(episode_rewards, group_size, steps, flag)
    if steps.module is None:
        raise ValueError(f"{flag} groups LM calls by module: the steps carry no module labels; return a "
                         "`step_modules` list (one module name per LM call) from the rollout_func.")
    if mmgrpo_grouping not in MMGRPO_GROUPINGS:
        raise ValueError(f"mmgrpo_grouping must be one of {MMGRPO_GROUPINGS}, got {mmgrpo_grouping!r}.")
    if steps.num_steps == 0:
        return torch.zeros(0)
    valid_ep = ~torch.isnan(episode_rewards)
    call = module_call_rank(steps)
    included = valid_ep[steps.episode]
    if mmgrpo_grouping == "truncate":
        included = included & (call < _truncated_lengths(steps, valid_ep, group_size))
    groups = torch.stack([steps.episode // group_size, steps.module, call], dim=1)
    _, segments = torch.unique(groups, dim=0, return_inverse=True)
    adv, _ = segment_normalize(episode_rewards[steps.episode], segments, included, scale=mmgrpo_scale,
                               unbiased=True, eps=ARBOR_STD_EPS)
    return torch.where(included, adv, torch.zeros_like(adv)).to(torch.float32)
