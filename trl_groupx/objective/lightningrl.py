"""LightningRL's accuracy anchor on text models: the clipped policy loss plus a token NLL term on the rollouts that
were correct, so that optimising the other rewards does not trade accuracy away.

LightningRL (catalog `lightningrl`, seed 004 ¶26) trains block-diffusion LLMs for more tokens per forward; its
reward and filter parts are specific to parallel decoding (docs/out-of-scope.md), but its loss is not: the policy
loss gains `w · NLL` on correct trajectories. This module ships that loss for autoregressive models. The per-row
weights that give the NLL its official normalisation whatever the run's `loss_aggregation` are computed on the
global generation batch by the trainer (requirement `nll_anchor_weights`, `nll_anchor_weights` below) and reach the
objective as `ObjectiveContext.anchor_weights`.
"""

from __future__ import annotations

import math

import torch

from ..contracts import ObjectiveContext
from ..registry import register
from .aggregation import resolved_aggregation
from .surrogates import clipped_surrogate

_OFFICIAL = ("SJTU-DENG-Lab/LightningRL@e4d7d293f3d5b1482cc3597a677af1c1c055ff53:models/sdar/modeling_sdar.py "
             "(SDARForCausalLM.forward, compute_rl_loss branch, NLL loss l.1259-1298; total l.1398)")
ANCHOR_AGGREGATIONS = ("sequence_mean", "global_token_mean", "constant", "sequence_sum")
REDUCTIONS = ("token", "sequence")


def _validate(config) -> None:
    coef = config.lightningrl_nll_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        raise ValueError(f"lightningrl_nll_coef must be a finite number >= 0 (official 0.1; 0 = the clipped policy "
                         f"loss alone), got {coef!r}.")
    threshold = config.lightningrl_nll_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"lightningrl_nll_threshold must be a finite number (a rollout whose total reward is at "
                         f"least this is 'correct'; 1.0 for 0/1 accuracy rewards), got {threshold!r}.")
    if config.lightningrl_nll_reduction not in REDUCTIONS:
        raise ValueError(f"lightningrl_nll_reduction must be one of {REDUCTIONS} (official 'token'), got "
                         f"{config.lightningrl_nll_reduction!r}.")
    aggregation = resolved_aggregation(config)
    if aggregation not in ANCHOR_AGGREGATIONS:
        raise ValueError(
            f"loss_type='lightningrl' with loss_aggregation={aggregation!r}: the NLL anchor is normalised over the "
            f"whole generation batch, which needs a batch-level normaliser; set loss_aggregation to one of "
            f"{ANCHOR_AGGREGATIONS} (official: 'sequence_mean')."
        )


def nll_anchor_weights(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    *,
    threshold: float,
    reduction: str,
    aggregation: str,
    max_completion_length: int,
) -> torch.Tensor:
    """Per-rollout weight `ω_i` `(N,)` of the NLL term, on the global generation batch.

    A rollout is correct when its total reward (the weighted sum of the reward functions, NaN = unscored = not
    correct) is at least `threshold` and it has loss tokens (`lengths` = active completion tokens, `(N,)`). With
    `C` the correct rollouts, `C_tok = Σ_{i∈C} |o_i|`, the official reductions of `−Σ_t log π(o_it)` are

        token:     (1 / C_tok) Σ_{i∈C} Σ_t −log π(o_it)             (mean over all correct tokens; official default)
        sequence:  (1 / |C|)   Σ_{i∈C} (1/|o_i|) Σ_t −log π(o_it)   (mean over correct rollouts of their token mean)

    The trainer's aggregation reduces a per-token loss `l_it` to `Σ_i a_i Σ_t l_it` over the batch, with
    `a_i = 1/(N |o_i|)` (sequence_mean), `1/N_tok` (global_token_mean), `1/(N L)` (constant, L =
    `max_completion_length`), `1/N` (sequence_sum). So `ω_i = 1 / (C_tok a_i)` (token) or `1 / (|C| |o_i| a_i)`
    (sequence) on correct rollouts and 0 elsewhere make `Σ_i a_i Σ_t ω_i (−log π)` the official value. No correct
    rollout → all zeros (the official code skips the term).
    """
    rewards, lengths = rewards.float(), lengths.float()
    correct = (torch.nan_to_num(rewards, nan=-math.inf) >= threshold) & (lengths > 0)
    weights = torch.zeros_like(rewards)
    if not correct.any():
        return weights
    n, n_tok = float(rewards.numel()), lengths.sum()
    scale = {"sequence_mean": n * lengths, "global_token_mean": n_tok.expand_as(lengths),
             "constant": torch.full_like(lengths, n * max_completion_length),
             "sequence_sum": torch.full_like(lengths, n)}[aggregation]  # 1 / a_i
    if reduction == "token":
        weights[correct] = scale[correct] / lengths[correct].sum()
    else:
        weights[correct] = scale[correct] / (correct.sum() * lengths[correct])
    return weights


@register(
    "lightningrl",
    name="LightningRL accuracy anchor (NLL on correct rollouts)",
    paper="LightningRL: Breaking the Accuracy-Parallelism Trade-off of Block-wise dLLMs via Reinforcement Learning, "
          "arXiv:2603.13319",
    official_code=_OFFICIAL,
    stage="objective",
    flags={"loss_type": "lightningrl", "lightningrl_nll_coef": 0.1, "lightningrl_nll_threshold": 1.0,
           "lightningrl_nll_reduction": "token", "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.01,
           "loss_aggregation": "sequence_mean"},
    requires=("nll_anchor_weights",),
    params=("lightningrl_nll_coef", "lightningrl_nll_threshold", "lightningrl_nll_reduction"),
    validate=_validate,
)
def lightningrl_surrogate(
    ctx: ObjectiveContext, *, epsilon: float, epsilon_high: float | None, lightningrl_nll_coef: float
) -> torch.Tensor:
    """Per-token loss `(B, T)`: PPO's clipped surrogate plus `w` times the weighted NLL of correct rollouts.

        l_it = −min(ρ_it A_i, clip(ρ_it, 1−ε_low, 1+ε_high) A_i)  +  w · ω_i · (−log π_θ(o_it))

    `ω_i` (`ctx.anchor_weights`, `(B,)`, from `nll_anchor_weights` on the global batch) is 0 on rollouts that were
    not correct and otherwise makes the run's aggregation of the second term equal the official reduction (mean
    over all correct tokens by default). On a batch with no correct rollout the loss is the surrogate alone. The
    NLL's gradient `−w ω_i ∇log π` pushes the correct rollouts' likelihood up whatever their advantage (a correct
    rollout in an all-correct group has A = 0 and still gets it) — the anchor.

    Source: the official LightningRL code, SJTU-DENG-Lab/LightningRL@e4d7d293f3d5:
    models/sdar/modeling_sdar.py l.1259-1298 (NLL over the correct samples' tokens, `nll_reduction_mode` "token" =
    mean over all correct tokens, "sequence" = mean over correct sequences of their token mean, times
    `rl_nll_weight`), l.1398 (`loss = policy_loss + kl_loss + nll_loss`); configs/lightningrl.yaml
    (`nll_loss_weight: 0.1`, `nll_reduction_mode: token`, `policy_reduction_mode: sequence`, clip `eps`/`eps_high`
    0.2, `kl_beta: 0.01`, `kl_estimator: k3`); train/train_policy_no_value.py l.354 (correctness = a sample's
    `correctness` key, else `reward >= 0`).

    Choices: "correct" = total reward ≥ `lightningrl_nll_threshold` (default 1.0, a solved problem under 0/1 accuracy
    rewards). The official configured path has no `correctness` key and falls back to `reward >= 0` on its
    z-scored accuracy+TPF reward (official-code.md notes that correct-but-slow samples then get no NLL); on text
    there is no TPF reward, so the threshold reads the accuracy directly — set it to your reward's scale. The
    official reductions act per micro-batch; ours act on the generation batch (`ω_i` from global counts), so the
    term does not depend on how the batch is split over micro-batches and processes. The KL term (`beta`, k3) is
    added per token and reduced with the policy loss (official: its own token-mean reduction). The official
    dLLM-specific parts — accuracy and TPF rewards z-scored per group and summed, TPF-range filtering — are not
    part of this loss (multi-reward normalisation: `gdpo_multireward` / `mo_grpo`; zero-variance filtering:
    `zero_variance_filter`).

    Shapes: `ctx.logps`, `ctx.old_logps`, `ctx.mask` `(B, T)`; `ctx.advantages` `(B, 1)` or `(B, T)`;
    `ctx.anchor_weights` `(B,)`, required when `lightningrl_nll_coef > 0`.
    """
    policy = clipped_surrogate(ctx, epsilon=epsilon, epsilon_high=epsilon_high, delta=None,
                               importance_sampling_level="token")
    if lightningrl_nll_coef == 0:
        return policy
    if ctx.anchor_weights is None:
        raise ValueError("loss_type='lightningrl' needs the per-rollout NLL weights (requirement "
                         "'nll_anchor_weights', filled by trl_groupx.GRPOTrainer); call it through the trainer, or "
                         "set lightningrl_nll_coef=0.")
    nll = torch.where(ctx.mask > 0, -ctx.logps, torch.zeros_like(ctx.logps))  # padding never read
    return policy + lightningrl_nll_coef * ctx.anchor_weights.to(nll)[:, None] * nll
