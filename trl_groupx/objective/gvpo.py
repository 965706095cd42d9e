"""GVPO: Group Variance Policy Optimization (arXiv:2504.19599).

GVPO regresses the group-centred implicit rewards `β·log(π_θ/π_θ')` of a group's rollouts onto their group-centred
actual rewards (an MSE over the group). The loss couples the rollouts of one prompt group through the group mean of
the implicit rewards, so the variant declares `requires=("group_structure",)` and needs every group whole inside one
micro-batch (checked in `_validate`).
"""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register

OFFICIAL = "jszkc/GVPO@627aa25e32acdaaa2c374946ccc703a7848ec8c1:GVPO/gvpo_core_algos.py"


def _validate(config) -> None:
    beta = config.gvpo_beta
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"gvpo_beta={beta!r} must be a finite number > 0 (GVPO's KL coefficient β; paper: 0.1).")
    if config.loss_aggregation not in (None, "sequence_mean"):
        raise ValueError(
            f"loss_type='gvpo' fixes its own normaliser (each group's squared-error sum / (G-1), averaged over "
            f"groups, i.e. 'sequence_mean' over its per-rollout terms); loss_aggregation={config.loss_aggregation!r} "
            "would reweight the rollouts by length. Leave loss_aggregation unset (or 'sequence_mean')."
        )
    if config.advantage_estimator == "grpo" and config.scale_rewards != "none":
        raise ValueError(
            f"loss_type='gvpo' regresses onto group-centred rewards R_i - mean_g(R) (paper; official script: "
            f"norm_adv_by_std_in_grpo=False), but scale_rewards={config.scale_rewards!r} divides them by a std. "
            "Set scale_rewards='none'."
        )
    if config.steps_per_generation != 1:
        raise ValueError(
            f"loss_type='gvpo' needs each prompt group whole inside one micro-batch, but steps_per_generation="
            f"{config.steps_per_generation} splits each generation batch into shuffled micro-batches that can cut a "
            "group. Set steps_per_generation=1 (TRL defaults it to gradient_accumulation_steps; with "
            "gradient_accumulation_steps > 1 every micro-batch then gets its own generation batch), or leave "
            "generation_batch_size unset."
        )
    if config.per_device_train_batch_size % config.num_generations:
        raise ValueError(
            f"loss_type='gvpo' needs each prompt group whole inside one process's micro-batch: "
            f"per_device_train_batch_size={config.per_device_train_batch_size} must be a multiple of "
            f"num_generations={config.num_generations}. Change one of the two."
        )
    if config.eval_strategy != "no":
        eval_generations = config.num_generations_eval or config.num_generations
        if config.per_device_eval_batch_size % eval_generations:
            raise ValueError(
                f"loss_type='gvpo' needs each prompt group whole inside one eval batch: "
                f"per_device_eval_batch_size={config.per_device_eval_batch_size} must be a multiple of "
                f"num_generations_eval (or num_generations)={eval_generations}. Change one of them."
            )


@register(
    "gvpo",
    name="GVPO (Group Variance Policy Optimization)",
    paper="GVPO: Group Variance Policy Optimization for Large Language Model Post-Training, arXiv:2504.19599",
    official_code=OFFICIAL,
    stage="objective",
    flags={"loss_type": "gvpo", "gvpo_beta": 0.1, "scale_rewards": "none", "beta": 0.0, "num_generations": 4,
           "steps_per_generation": 1, "loss_aggregation": "sequence_mean"},
    params=("gvpo_beta",),
    requires=("group_structure",),
    validate=_validate,
)
def gvpo_surrogate(ctx: ObjectiveContext, *, gvpo_beta: float) -> torch.Tensor:
    """GVPO, one value per rollout broadcast over its tokens `(B, T)`.

    For rollout `i` of prompt group `g` (`n` rollouts), with token log-ratios to the rollout policy
    `d_it = logπ_θ(o_it) − logπ_old(o_it)` and loss mask `m_it`:

        rθ_i = β · Σ_t m_it d_it                      implicit reward (sequence SUM of token log-ratios)
        m_g  = sg( mean_{j ∈ g, |o_j|>0} rθ_j )        group mean of the implicit rewards, detached
        Â_i  = advantage of i (TRL with scale_rewards="none": R_i − mean_g R; a token-level one is mask-averaged)
        ℓ_i  = ½ ((rθ_i − m_g) − Â_i)² · n/(n−1)      (0 for a rollout without loss tokens, and for n = 1)

    The returned `(B, T)` tensor is `ℓ_i` on every position of row `i`; with the aggregation `"sequence_mean"`
    (paper default, the only one `validate` accepts) the loss is `mean_i ℓ_i`, which for whole groups of equal size
    is the mean over the batch's groups of the paper's per-group estimator `Σ_{i∈g} ½(...)² / (n−1)`. The gradient
    is `∂L/∂logπ_θ(o_it) = β · ((rθ_i − m_g) − Â_i) · n/(n−1) · m_it / B` for `B` rows in the micro-batch (then
    `/ gradient_accumulation_steps`, as every objective).

    Paper (Zhang et al., arXiv:2504.19599; the official README restates it):
    `L = ½ Σ_x Σ_i [(Rθ(x,y_i) − mean_j Rθ(x,y_j)) − (R(x,y_i) − mean_j R(x,y_j))]²` with `Rθ = β log(π_θ/π_θ')`,
    and `1/(k−1)` for the unbiased estimate over `k` samples.
    Official code: jszkc/GVPO@627aa25e32acdaaa2c374946ccc703a7848ec8c1, `GVPO/gvpo_core_algos.py`,
    `compute_policy_loss_gvpo` l.39-60: l.41 `rθ = β(Σ logp·m − Σ old_logp·m)`; l.42 `Â` = mask-mean of the
    advantages; l.44-55 the implicit rewards are all-gathered *detached* across data-parallel ranks and averaged per
    prompt uid (asserting all `n` members are present); l.56-59 `Σ_{rows of the local micro-batch} ½((rθ_i − m_g) −
    Â_i)² / (n−1)`. `GVPO/gvpo_dp_actor.py` `update_policy` (l.365-) passes the old (rollout) log-probs as `π_θ'`
    (l.438-441, l.446-455) and scales the loss by `1/gradient_accumulation` (l.428); `GVPO/run_qwen2-7b_math_gvpo.sh`:
    `adv_estimator=grpo`, `norm_adv_by_std_in_grpo=False`, `gvpo_beta=0.1`, `rollout.n=4`, `lr=1e-6`,
    `use_kl_loss=False`; `GVPO/gvpo_ray_trainer.py` `_balance_batch` (l.7-51) keeps groups inside one micro-batch.

    Choices:
    - `π_θ'` is the rollout (old) policy, as the official code (not a frozen reference model; TRL's `beta` KL
      penalty stays separate and defaults to 0, as `use_kl_loss=False`). On-policy (`num_iterations=1`) `rθ = 0` in
      value and the gradient is `−β·n/(n−1)·Â_i/B` per token: a REINFORCE step on the centred reward.
    - `m_g` is detached, as the official code (l.46 `.clone().detach()`). The paper's undetached mean gives the same
      gradient whenever the advantages of the group's active rollouts sum to zero (TRL's centred rewards with every
      rollout active): `∂/∂rθ_j ½Σ_i(c_i − Â_i)² = (c_j − Â_j) − mean_i(c_i − Â_i)` and `Σ_i c_i = 0`.
    - Normaliser: the official loss is a *sum* over the local micro-batch (l.57-59) scaled by `1/grad_accum`, so its
      size depends on `ppo_micro_batch_size_per_gpu` (official script: 16 rows = 4 groups per GPU; the official
      step equals `micro_batch_size_per_gpu / n` = 4 times ours). We average over groups instead: the loss of a
      micro-batch holding one group (one process) is exactly the official one, and the loss no longer depends on how many groups
      a micro-batch holds. A constant loss factor leaves AdamW's steps unchanged (up to ε and gradient clipping),
      so the paper's learning rate carries over. `n` is the group's row count in the micro-batch (= `G` by the
      config check), the official fixed `rollout.n`.
    - Rollouts without loss tokens (dropped by a sampling filter, `mask_truncated_completions`, an empty
      completion) have no log-ratio to compare: they add no loss and stay out of `m_g` (the official code would
      divide 0/0 on l.42). Their row still counts in `n` and in `B`. A group of one (`num_generations_eval=1`) gets
      0 (`1/(n−1)` undefined; its centred reward is 0).
    - A rollout no reward function scored (NaN reward) arrives with `Â = 0` from the advantage stage; it still has a
      log-ratio, so it stays in `m_g` and its implicit reward is regressed towards the group mean.
    - TRL's per-token masks (`top_entropy_quantile`, `off_policy_mask_threshold`, vLLM IS correction) multiply
      the broadcast `ℓ_i` token by token, i.e. scale row `i`'s term by the mean of its token factors; the paper has
      none of them.

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`;
    `ctx.group_ids` `(B,)` long (rows shuffled; every group present must have the same number of rows). Padding is
    never read (`torch.where`, so even non-finite padding log-probs are harmless). Raises `ValueError` without group
    ids, with unequal group sizes (a group cut by the micro-batch split) and with non-finite advantages (a ±inf
    reward: fix the reward function).
    """
    if ctx.group_ids is None:
        raise ValueError(
            "loss_type='gvpo' needs each row's prompt-group id (ObjectiveContext.group_ids); the trl_groupx trainer "
            "fills it for objectives registered with requires=('group_structure',)."
        )
    mask = ctx.mask
    real = mask > 0
    adv = ctx.advantages
    if not torch.isfinite(torch.where(real, adv, 0.0)).all():
        raise ValueError(
            "loss_type='gvpo' got non-finite advantages: a reward function returned ±inf or NaN that reached the "
            "advantages (TRL's advantage computation passes ±inf through). Fix the reward function(s) in reward_funcs."
        )
    lengths = mask.sum(-1)  # (B,)
    if adv.shape[-1] == 1:
        target = adv[:, 0]
    else:  # token-level advantages: their mask-mean (official l.42)
        target = torch.where(real, adv, 0.0).mul(mask).sum(-1) / lengths.clamp(min=1.0)
    token_log_ratio = torch.where(real, ctx.logps - ctx.old_logps, torch.zeros_like(ctx.logps))
    r_theta = gvpo_beta * (token_log_ratio * mask).sum(-1)  # (B,)

    _, group, counts = torch.unique(ctx.group_ids, return_inverse=True, return_counts=True)
    if (counts != counts[0]).any():
        raise ValueError(
            f"loss_type='gvpo' needs whole prompt groups in each micro-batch, got group sizes {counts.tolist()}: "
            "set steps_per_generation=1 and per_device_train_batch_size a multiple of num_generations."
        )
    active = (lengths > 0).to(r_theta.dtype)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=r_theta.dtype, device=r_theta.device).index_add_(
        0, group, r_theta.detach() * active
    )
    members = torch.zeros(n_groups, dtype=r_theta.dtype, device=r_theta.device).index_add_(0, group, active)
    group_mean = (sums / members.clamp(min=1.0))[group]  # (B,), detached
    n = counts[group].to(r_theta.dtype)
    weight = torch.where(n > 1, n / (n - 1).clamp(min=1.0), torch.zeros_like(n)) * active
    per_rollout = 0.5 * ((r_theta - group_mean) - target) ** 2 * weight  # (B,)
    return per_rollout.unsqueeze(-1).expand_as(ctx.logps)
