"""The four stage contracts: what a variant's pure function receives and returns.

Notation: `N` rollouts in the (global) generation batch, laid out as `N / G` contiguous groups of `G` rollouts
(`G = num_generations`); `K` reward functions; `T` completion length (padded); masks are 1 on real completion
tokens and 0 on padding. Keyword-only arguments of a variant's function are filled from the `GRPOConfig` field of
the same name, so a variant declares its hyper-parameters by naming them.

Sampling (`rollout_filter`)
    `fn(batch: RolloutBatch, *, <config fields>) -> keep (N,) bool`. Rollouts with `keep=False` stay in the batch
    (group shapes and process slices are fixed) but get advantage 0 and completion mask 0, so they neither move
    the policy nor count in any normaliser.

Advantages (`advantage_estimator`)
    `fn(rewards: (N,) or (N, K), group_size: int, *, <config fields>) -> advantages (N,)`. `rewards` is the
    weighted sum of the reward functions (or the per-function matrix for multi-reward aggregators), gathered over
    all processes; NaN marks a rollout that no reward function scored. Contract: NaN rewards are excluded from
    every group statistic and get advantage 0; the output is finite. A variant that also leaves rollouts out of the
    update (MC-GRPO's median pivot) returns `(advantages, keep (N,) bool)`; the trainer masks them as it masks the
    sampling stage's drops.

Token weights (`token_weighting`)
    `fn(advantages: (N,), ctx: TokenContext, *, <config fields>) -> advantages (N, T)`. Values at padding
    positions are ignored by the loss but must be finite; statistics must never read them.

A variant that reads particular columns of the reward matrix names them with config fields ending in
`_reward_index` (listed in its `params`); the trainer checks at construction that each points at one of its
reward functions.

Variants may also declare (in `requires`) inputs that the trainer passes as keyword arguments:
`completion_lengths` (N,) for advantage variants, and `global_step`, `total_steps` (optimizer steps done and
planned) for schedules in any stage.

`prompt_keys` (N,) int64 for advantage variants that keep per-prompt state across steps (SPO's value tracker): a
stable 63-bit BLAKE2b hash of each rollout's unpadded prompt token ids (`trl_groupx.advantages._prompt_keys`),
gathered in global order like the rewards, identical on every process and across runs (not Python's salted hash).

`prompt_kl` (N,) float64 for advantage variants whose per-prompt state decays with the policy's drift (SPO's
KL-adaptive ρ): `D = masked mean |log π_stored − log π_current|` over the completion tokens of the response the
prompt got at its last visit, log-probs stored under the policy of that visit and re-scored by the current one;
NaN for a prompt never seen; the same for every row of a prompt and on every process. The trainer keeps one
response per prompt (`trl_groupx.advantages.prompt_kl`), saved with checkpoints, and computes it in training only
(NaN everywhere in evaluation); a variant with a `<id>_rho_mode` param gets it only when that field is `"kl"`.

`greedy_baseline_rewards` / `reference_sample_rewards` (N,) for advantage variants whose baseline is an extra
completion (ReMax, AAPO): the reward of the greedy completion of each rollout's prompt under the current policy
(shared by the group), or of one completion per rollout sampled from the frozen reference model; scored by the
run's reward functions and weights, NaN when unscorable (`trl_groupx.sampling.baseline_rollouts`).

`counterfactual_rewards` (N,) float32 for advantage variants that credit one agent of a multi-agent episode by a
counterfactual (CCPO): the reward of each episode's run without that agent, whose token ids the rollout_func returns
per row as `counterfactual_completion_ids`; decoded and scored like the rollouts by the run's reward functions and
weights, NaN when unscorable (`trl_groupx.sampling.counterfactual_rewards`).

`prompt_value_logits` (N,) float32 for advantage variants with a learned prompt value (SPPO): the logit `V(x)` of a
separate value model (`sppo_value_model`, a scalar head at each prompt's last token) for each rollout's prompt, in
global order, computed before that model's BCE update on the batch (an update in training only); the same on every process
(`trl_groupx.advantages.sppo_value`).

`judge_scores` (N,) float32 for advantage variants that re-score groups by a user-supplied judge (SGPO,
`allneg_aifeedback`): the judge's score of each response of the groups the variant selects (all-negative ones, decided
on the global rewards), NaN elsewhere and in evaluation; each process judges its own rows and the scores are
gathered (`trl_groupx.advantages.allneg_aifeedback.judge_scores_for_batch`).

`pair_similarity` (N/G, G, G) float32 for advantage variants that compare the responses of a group pairwise (DaGRPO,
`dagrpo`): a registered scorer's similarity of each pair of a group's completions, NaN where unscored and in
evaluation; group g is scored by process g mod P and the matrices are summed over processes
(`trl_groupx.advantages.dagrpo.pair_similarity_for_batch`).

Multi-turn step credit (`requires=("step_structure",)`, advantage variants)
    `fn(rewards: (N,), group_size: int, steps: StepBatch, *, <config fields>) -> per-step advantages (S,)`.
    `steps` (`trl_groupx.advantages.step_credit.StepBatch`) lists the `S` model turns of the global batch: episode
    (global row), index in the episode, anchor-state key, step reward. The trainer reads them per row from the
    rollout_func extra fields `step_states` / `step_rewards` (TRL merges those into each row's input dict) or from
    `environment._step_structure()` (environment_factory), and writes step `j`'s advantage on the tokens of turn `j`
    (the `j`-th run of `tool_mask == 1`): the output advantages are `(B, T)`, so no token-weight variant can
    follow. Optional: a rollout_func field `step_final_state` (the observation after the episode's last action)
    fills `StepBatch.final_state` (`(N,)` keys, −1 where a row gave none; `None` when no row did); only `graphgpo`
    reads it.
    `requires=("step_modules",)` too (mmgrpo: one step = one LM call of a multi-module program): the rollout_func
    field `step_modules` (one module name per step, hashed with `state_key`) fills `StepBatch.module` (`(S,)` long);
    every row must give it (the trainer raises otherwise), and `step_states` may then be omitted.

Stateful variants (running baselines, priors, replay buffers, schedules) take a keyword-only `state: dict` that
they read and update in place, with tensors and plain numbers only. The trainer passes the same dict on every
call, keeps it identical on every process (it is updated from the same global batch everywhere) and saves it
with each checkpoint, so a resumed run continues exactly.

Objective (`loss_type`)
    `fn(ctx: ObjectiveContext, *, <config fields>) -> per-token loss (N, T)` (or `(N, 1)`, broadcast over
    tokens). The surrogate only; the normaliser is `trl_groupx.objective.aggregate`, chosen by `loss_aggregation`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from trl.trainer.utils import nanstd as trl_nanstd


@dataclass
class RolloutBatch:
    """Global generation batch handed to a sampling-stage filter.

    Attributes:
        rewards (`torch.Tensor`): `(N,)` weighted rewards, NaN where unscored.
        completion_lengths (`torch.Tensor`): `(N,)` number of completion tokens.
        group_size (`int`): `G`.
        steps (`StepBatch` or `None`): per-step view of multi-turn episodes (see "Multi-turn step credit").
        group_sizes (`torch.Tensor` or `None`): `(M,)` sizes of the consecutive groups when they vary
            (`sampling/group_layout.py`); `None` when every group has `group_size` rows.
    """

    rewards: torch.Tensor
    completion_lengths: torch.Tensor
    group_size: int
    steps: Any = None  # `StepBatch` of the batch when the advantage variant requires "step_structure", else None
    group_sizes: torch.Tensor | None = None


@dataclass
class TokenContext:
    """Per-token inputs of the token-weight stage, all `(N, T)` and aligned with the completion tokens.

    Attributes:
        completion_mask (`torch.Tensor`): 1 on completion tokens, 0 on padding.
        group_size (`int`): `G`; rows `g*G ... g*G+G-1` are one group.
        entropies (`torch.Tensor` or `None`): policy entropy at each position (rollout policy, detached).
        logps (`torch.Tensor` or `None`): log-probability of each sampled token under the rollout policy.
        ref_logps (`torch.Tensor` or `None`): same under the reference model (only when `beta != 0`).
        completion_ids (`torch.Tensor` or `None`): the sampled token ids.
        rewards (`torch.Tensor` or `None`): `(N,)` rewards behind the advantages.
        sum_pi_squared (`torch.Tensor` or `None`): `Σ_v π_v²` of the rollout policy's next-token distribution at each
            position (temperature-scaled, detached, 0 on padding); only for variants that require `"sum_pi_squared"`.
        rewards_per_func (`torch.Tensor` or `None`): `(N, K)` rewards of each reward function (NaN = unscored,
            rows dropped by the sampling stage too); only for variants that require `"rewards_per_func"`.
        token_blocks (`torch.Tensor` or `None`): `(N, T)` long, the text block (index `k` into the variant's
            `*_block_tags`, scored by `reward_funcs[k]`) of each completion token, `-1` outside every block and on
            padding (`trl_groupx.token_weights.blocks`); only for variants that require `"token_blocks"`.
        contrast_logps (`torch.Tensor` or `None`): log-probability of each sampled token under the rollout policy
            with the row's prompt replaced by its negative prompt (`gcpo_guidance_negative_template` or
            `gcpo_guidance_negative_prompt_fn`; `trl_groupx.token_weights.gcpo_guidance.negative_prompt_logps`),
            detached; only for variants that require `"contrast_logps"`.
        intra_group_token_divergence (`torch.Tensor` or `None`): `(N, T)` float32, TW-GRPO's `D_t` of each group
            (`trl_groupx.token_weights.tw_grpo.group_token_divergence`: how much the `G` rollout-policy next-token
            distributions of the group disagree at position `t`, padding entering as the uniform distribution), the
            same on every row of the group at the positions before its longest completion, 0 after; detached; only
            for variants that require `"intra_group_token_divergence"`.
        tempered_logps (`torch.Tensor` or `None`): `(N, T, M)` float32, log-probability of each sampled token under
            the rollout policy with the raw logits divided by each of the `M` temperatures of the variant's
            `*_temperatures` field, in that order (`trl_groupx.token_weights.tempered_logps`), detached, 0 on
            padding; `logps` and `entropies` then come from the same forward. Only for variants that require
            `"tempered_logps"`.
        dpo_logps (`torch.Tensor` or `None`): `(N, T)` float32, log-probability of each sampled token under the
            frozen DPO-trained model of `rto_dpo_model` (logits divided by the sampling temperature), no grad, one
            forward per generation batch (`trl_groupx.token_weights.rto`); only for variants that require
            `"dpo_logps"` (RTO).
        prm_step_ids (`torch.Tensor` or `None`): `(N, T)` long, the reasoning step (0-based, text split at the
            variant's delimiter) of each completion token of the rows whose steps a process reward model scored, −1
            on padding and on every other row; with `prm_step_scores` (`trl_groupx.token_weights.verigate_step`).
        prm_step_scores (`torch.Tensor` or `None`): `(N, S)` float32, the PRM's score of each step, left-aligned,
            NaN-padded, NaN rows where it was not called (groups the verifier separates, evaluation) or returned
            `None`; both `None` when no row was scored. Only for variants that require `"prm_step_scores"`
            (VeriGate step credit; the PRM is called on the degenerate groups only).
        belief_segment_ids (`torch.Tensor` or `None`): `(N, T)` long, the segment (0-based) of each completion token
            between the cut points of `trl_groupx.token_weights.belief_probe`, −1 on padding (and on every token of
            a batch that was not probed); only for variants that require `"answer_belief"` (GRPO-VPS).
        answer_belief_logps (`torch.Tensor` or `None`): `(N, K + 1)` float32, at each segment boundary `k` (prefix
            of the first `c_k` completion tokens, `c_0 = 0`) the no-grad teacher-forced log-probability of the row's
            reference answer appended through the variant's template, under the rollout policy; NaN past the row's
            last boundary (`trl_groupx.token_weights.belief_probe_forward`); with `belief_segment_ids`.
        segment_mc_values (`torch.Tensor` or `None`): `(N, T)` float32, at each cut token `j` of a completion (its
            low-probability tokens, `trl_groupx.token_weights.spo_segment.cut_points`) the mean reward of K
            continuations of `prompt + completion[:j]` sampled from the policy by TRL's generator and scored by the
            run's reward functions as the response `completion[:j] + continuation`; NaN elsewhere and in evaluation
            (`trl_groupx.token_weights.spo_segment_rollouts`); only for variants that require `"segment_mc_values"`
            (SPO-chain). Under SPO-tree the node values of the group's tree at its segment boundaries instead
            (`trl_groupx.token_weights.spo_tree_rollouts.tree_values`).
        segment_multiplicity (`torch.Tensor` or `None`): `(N, T)` float32, SPO-tree only, training batches only: how
            many rows of the group share each token's tree edge (`spo_tree.segment_multiplicity`).
    """

    completion_mask: torch.Tensor
    group_size: int
    entropies: torch.Tensor | None = None
    logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    completion_ids: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None
    rewards_per_func: torch.Tensor | None = None
    token_blocks: torch.Tensor | None = None
    contrast_logps: torch.Tensor | None = None
    intra_group_token_divergence: torch.Tensor | None = None
    tempered_logps: torch.Tensor | None = None
    dpo_logps: torch.Tensor | None = None
    prm_step_ids: torch.Tensor | None = None
    prm_step_scores: torch.Tensor | None = None
    belief_segment_ids: torch.Tensor | None = None
    answer_belief_logps: torch.Tensor | None = None
    segment_mc_values: torch.Tensor | None = None
    segment_multiplicity: torch.Tensor | None = None


@dataclass
class ObjectiveContext:
    """Inputs of an objective's per-token surrogate, for one micro-batch of `B` rollouts.

    Attributes:
        logps (`torch.Tensor`): `(B, T)` log-probs of the sampled tokens under the current policy (with grad).
        old_logps (`torch.Tensor`): `(B, T)` same under the rollout policy (detached).
        advantages (`torch.Tensor`): `(B, T)` or `(B, 1)` advantages.
        mask (`torch.Tensor`): `(B, T)` loss mask (completion mask times tool mask).
        entropies (`torch.Tensor` or `None`): `(B, T)` current-policy entropies (detached).
        group_ids (`torch.Tensor` or `None`): `(B,)` long, the prompt group of each row (rows arrive shuffled);
            filled for objectives that declare `requires=("group_structure",)`.
        teacher_logps (`torch.Tensor` or `None`): `(B, T)` float32, log-probability of each sampled token under a
            frozen teacher model (logits divided by the sampling temperature), no grad, computed once per generation
            batch (`trl_groupx.objective.dgrpo.teacher_token_logps`); filled for objectives that declare
            `requires=("teacher_logps",)` (dGRPO's `opd_teacher_model`), `None` when their `opd_coef` is 0.
        anchor_weights (`torch.Tensor` or `None`): `(B,)` float32, per-rollout weight of an NLL anchor on correct
            rollouts (`trl_groupx.objective.lightningrl.nll_anchor_weights`, computed on the global generation
            batch; 0 on rollouts that were not correct); filled for objectives that declare
            `requires=("nll_anchor_weights",)`.
        turn_ids (`torch.Tensor` or `None`): `(B, T)` long, the assistant turn (action) of each completion token, 0
            for the first, −1 on tool / environment tokens and padding (`step_credit.turn_index_from_tool_mask`; one
            turn where there is no tool mask); filled when the config sets `importance_sampling_level="turn"`, which
            objectives that take `importance_sampling_level` read through `surrogates.log_ratio` (GAGPO's
            action-level ratio, `trl_groupx.objective.turn_ratio`).
        self_distill (`SelfDistillBatch` or `None`): SRPO's self-distillation inputs
            (`trl_groupx.objective.self_teacher.SelfDistillBatch`): `routed (B,)` bool (failed rollouts with a correct
            sibling), `weights (B, T)` entropy weights, `teacher_topk_logps (B, T, k)` (the self-teacher — the policy
            re-prompted with a correct sibling — on its top-k tokens, no grad, once per generation batch) and
            `student_topk_logps (B, T, k)` (the current policy on the same ids, with grad, from the loss forward);
            filled for objectives that declare `requires=("self_teacher_topk",)`, `None` when no row of the
            micro-batch is routed.
    """

    logps: torch.Tensor
    old_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropies: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    teacher_logps: torch.Tensor | None = None
    anchor_weights: torch.Tensor | None = None
    turn_ids: torch.Tensor | None = None
    self_distill: Any = None  # `SelfDistillBatch` for objectives that require "self_teacher_topk", else None


# Keyword-only arguments the trainer supplies itself (see `requires` in registry.py), not read from the config.
TRAINER_SUPPLIED = frozenset({"state", "completion_lengths", "global_step", "total_steps", "steps", "prompt_keys",
                              "greedy_baseline_rewards", "reference_sample_rewards", "prompt_kl",
                              "counterfactual_rewards", "judge_scores", "prompt_value_logits",
                              "pair_similarity"})


def config_kwargs(fn: Callable[..., Any], config: Any) -> dict[str, Any]:
    """Values of the keyword-only parameters of `fn` (but those in `TRAINER_SUPPLIED`), read from `config` fields of
    the same name."""
    kwargs = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind is inspect.Parameter.KEYWORD_ONLY and name not in TRAINER_SUPPLIED:
            if not hasattr(config, name):
                raise AttributeError(f"{fn.__qualname__} reads config field {name!r}, which GRPOConfig lacks.")
            kwargs[name] = getattr(config, name)
    return kwargs


# --- group helpers shared by the stages -------------------------------------------------------------------------


def grouped(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """View `(N, ...)` as `(N/G, G, ...)`; a clear error when `N` is not a multiple of `G`."""
    if x.shape[0] % group_size != 0:
        raise ValueError(f"{x.shape[0]} rollouts do not split into groups of {group_size}.")
    return x.view(x.shape[0] // group_size, group_size, *x.shape[1:])


def nan_group_mean(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Mean of each group over its non-NaN members, broadcast back to `(N,)` (NaN for an all-NaN group)."""
    return torch.nanmean(grouped(rewards, group_size), dim=1).repeat_interleave(group_size)


def nan_std(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased (Bessel) std over non-NaN entries; NaN where fewer than two. TRL's own `nanstd`, so that our
    numbers match TRL's bit for bit."""
    return trl_nanstd(x, dim=dim, keepdim=keepdim)


def nan_group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Unbiased std of each group over its non-NaN members, broadcast back to `(N,)`."""
    return nan_std(grouped(rewards, group_size), dim=1).repeat_interleave(group_size)
