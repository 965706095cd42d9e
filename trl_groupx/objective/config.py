"""Objective-stage fields of `trl_groupx.GRPOConfig` (the selector is TRL's own `loss_type`), one block per variant."""

from __future__ import annotations

from dataclasses import dataclass, field

from .aggregation import AGGREGATIONS


@dataclass
class ObjectiveArgs:
    """
    loss_aggregation (`str` or `None`, *optional*, defaults to `None`):
        Normaliser for a trl_groupx objective: `"sequence_mean"`, `"token_mean"`, `"global_token_mean"`,
        `"constant"` or `"sequence_sum"`. `None` uses the objective's paper default. TRL's loss types fix their own.
    balanced_agg_scope (`str`, defaults to `"group"`):
        Sign classes of `loss_aggregation="balanced"` (Balanced Aggregation): formed `"group"` by group (the paper)
        or over the whole `"batch"`.
    kl_estimator (`str`, defaults to `"k3"`):
        Per-token estimator of the KL penalty `beta * KL(pi || pi_ref)`: `"k3"` (TRL's), `"k1"`, `"k2"` or `"abs"`
        (see `trl_groupx.objective.kl`). Needs `beta > 0`. With a TRL loss type other than `"k3"`, the loss is
        computed by trl_groupx's reference of that loss type (identical to TRL's for `"k3"`).
    beta_negative (`float` or `None`, defaults to `None`):
        KL coefficient of completions with a negative advantage (MDP-GRPO's asymmetric KL: `beta` applies where
        `A >= 0`, `beta_negative` where `A < 0`; paper 0.01 / 0.025). Needs `beta > 0`. `None`: `beta` everywhere.
        Like `kl_estimator`, a TRL loss type then runs through trl_groupx's reference of that loss.

    > gmpo
    gmpo_clip (`float`, defaults to `0.4`): GMPO's log-space clip `c`.

    > holderpo
    holderpo_p_start (`float`, defaults to `2.0`): HölderPO: power `p` of the Hölder mean of token ratios at step 0
        (official script: 2).
    holderpo_p_end (`float`, defaults to `-2.0`): HölderPO: `p` reached after `holderpo_schedule_steps` optimizer
        steps and kept afterwards (official script: −2).
    holderpo_schedule_steps (`int`, defaults to `500`): HölderPO: length of the linear `p` schedule in optimizer
        steps, ≥ 1 (official script: 500).
    holderpo_schedule (`str`, defaults to `"linear"`): HölderPO: `"linear"` (start → end) or `"constant"` (`p =
        holderpo_p_start` throughout; e.g. 1 = arithmetic mean, 0 = geometric mean).

    > dual_clip
    dual_clip_c (`float`, defaults to `3.0`): dual-clip PPO's cap `c > 1` on the ratio of negative-advantage tokens
        (verl's `clip_ratio_c`).

    > clip_cov
    clip_cov_ratio (`float`, defaults to `2e-4`): fraction of a micro-batch's tokens whose gradient Clip-Cov cuts.
    clip_cov_lb (`float`, defaults to `1.0`): lower bound of the covariance window the cut tokens are drawn from.
    clip_cov_ub (`float`, defaults to `5.0`): upper bound of that window.

    > kl_cov
    kl_cov_ratio (`float`, defaults to `2e-3`): fraction of a micro-batch's tokens (top covariance) KL-Cov penalises.
    kl_cov_coef (`float`, defaults to `1.0`): weight of the `|log ρ|` penalty on them.

    > dppo_tv
    dppo_tv_delta (`float`, defaults to `0.15`): DPPO-Binary-TV trust-region radius on `|p - p_old|`.
    dppo_tv_is_cap (`float`, defaults to `10000.0`): cap `C` of the detached importance weight.

    > dro
    dro_beta (`float` or `None`, defaults to `None`): DRO: weight β of the quadratic log-ratio penalty
        `β/2 (logp - logp_old)²`; required (positive) with `loss_type="dro"` (verl's test value 0.05).

    > dppo_kl
    dppo_kl_delta (`float`, defaults to `0.05`): DPPO-Binary-KL trust-region radius on the binary KL.
    dppo_kl_is_cap (`float`, defaults to `10000.0`): cap `C` of the detached importance weight.

    > ctpo
    ctpo_clip_low (`float`, defaults to `0.025`): CTPO: log-space lower clip base; bound at position t is
        `-ctpo_clip_low * t**ctpo_power` (official `la_clip_low`).
    ctpo_clip_high (`float`, defaults to `0.05`): CTPO: log-space upper clip base (official `la_clip_high`).
    ctpo_clip_c (`float`, defaults to `0.05`): CTPO: log-space dual-clip base; negative-advantage tokens are capped at
        ratio `exp(ctpo_clip_c * t**ctpo_power)` (official `la_clip_c`).
    ctpo_power (`float`, defaults to `0.5`): CTPO: exponent of the position scaling `t**p` (official
        `clip_ratio_la_power`; 0 = uniform clip).
    ctpo_ratio_mode (`str`, defaults to `"cumprod"`): CTPO: `"cumprod"` (cumulative product of token ratios, the
        paper) or `"geomean"` (running geometric mean, the official code's other mode).

    > dhpo
    dhpo_mix_weight (`float`, defaults to `0.5`): DHPO: weight `w` of the token-level (GRPO) ratio in the hybrid ratio,
        `1 - w` on the sequence-level (GSPO) ratio; 0.5 = averaged mixing. 1 = GRPO, 0 = GSPO.
    dhpo_mix_mean (`str`, defaults to `"arithmetic"`): DHPO: `"arithmetic"` (`w r + (1-w) s`) or `"geometric"`
        (`r^w s^(1-w)`) mix; the paper's form was not available to us, hence a flag.
    dhpo_seq_epsilon (`float`, defaults to `3e-4`): DHPO: lower trust-region width of the sequence branch (GSPO's).
    dhpo_seq_epsilon_high (`float`, defaults to `4e-4`): DHPO: upper trust-region width of the sequence branch.

    > offpolicy_grpo
    offpolicy_grpo_lag (`int`, defaults to `10`): Off-policy GRPO: optimizer steps between two syncs of the rollout
        policy, `v` (paper: 10); requires `steps_per_generation = v × gradient_accumulation_steps`. 1 = on-policy.

    > gvpo
    gvpo_beta (`float`, defaults to `0.1`): GVPO: coefficient β of the implicit reward β·Σ_t log(π_θ/π_old) that is
        regressed onto the group-centred rewards (paper and official script: 0.1); > 0. Not TRL's `beta` (KL penalty).

    > thinkless
    thinkless_alpha (`float`, defaults to `0.001`): Thinkless/DeGRPO: weight α of the control-token loss (completion
        position 0) against the response loss (official `thinkless_alpha`); the normalisation follows
        `loss_aggregation` (`sequence_mean`: paper, `token_mean`: official code per micro-batch).

    > hapo_clip
    hapo_clip_alpha (`float`, defaults to `1.0`): HAPO Asymmetric Adaptive Clipping: `α` of the per-token bounds
        `ε_low (1 − α ĥ)` for low-entropy tokens (ĥ ≤ 0) and `ε_high (1 + α ĥ)` for high-entropy ones (official
        `clip_alpha`).
    hapo_clip_entropy_pivot (`float`, defaults to `0.8`): quantile of the micro-batch's log-entropies that splits
        low from high entropy (official `entropy_pivot`).
    hapo_clip_c (`float`, defaults to `10.0`): dual-clip cap `c > 1` on the ratio of negative-advantage tokens
        (official `clip_ratio_c`; `inf` = no cap).
    hapo_clip_official_sign (`bool`, defaults to `False`): use the official code's unsigned `ĥ = |ĥ|`
        (`scale_neg = 1/neg_min`: only the upper bound ever widens) instead of the paper's signed `ĥ`.

    > fiberpo
    fiberpo_epsilon (`float`, defaults to `0.05`): FiberPO: half-width ε of the fibre band on each token's log-ratio
        deviation from its same-sign trajectory mean; tokens outside get no gradient. Choice (the paper gives no
        value; it asks ε ≪ C+ + C−).
    fiberpo_c_pos (`float`, defaults to `0.28`): FiberPO: trajectory budget C+ on the mean upward log-ratio (gates
        `A > 0` trajectories). Choice (no paper value; DAPO's clip-high reused, C− < C+ as the paper asks).
    fiberpo_c_neg (`float`, defaults to `0.2`): FiberPO: trajectory budget C− on the mean downward log-ratio (gates
        `A < 0` trajectories). Choice (no paper value; DAPO's clip-low reused).
    fiberpo_rollback_slope (`float`, defaults to `1.0`): FiberPO: slope −κ of the trajectory gate beyond its budget
        (the rollback zone); 1 = reflection, 0 = flat clip. Choice (the slope is not given to us).

    > dgrpo
    opd_teacher_model (`str` or `None`, defaults to `None`): dGRPO: model id or local path of the teacher (a stronger
        causal LM with the student's tokenizer), loaded once by the trainer, frozen. Needed when `opd_coef > 0`.
    opd_coef (`float`, defaults to `1.0`): dGRPO: weight λ ≥ 0 of the on-policy distillation term (per-token
        sampled reverse KL to the teacher) added to GRPO's loss; 0 = plain GRPO. Choice (the paper's λ is not given to
        us; verl's default distillation coefficient).

    > lightningrl
    lightningrl_nll_coef (`float`, defaults to `0.1`): LightningRL: weight `w ≥ 0` of the token NLL of the correct
        rollouts added to the clipped policy loss (official `nll_loss_weight`).
    lightningrl_nll_threshold (`float`, defaults to `1.0`): LightningRL: a rollout is correct when its total reward
        (weighted sum of the reward functions) is at least this. Choice: 1.0 = solved under 0/1 accuracy rewards.
    lightningrl_nll_reduction (`str`, defaults to `"token"`): LightningRL: `"token"` = mean over all correct tokens
        (official default), `"sequence"` = mean over correct rollouts of their token mean.

    > srpo
    srpo_success_threshold (`float`, defaults to `1.0`): SRPO: a rollout is correct at total reward ≥ this (the
        paper's r = 1); failed rollouts of a group with a correct one are routed to self-distillation.
    srpo_entropy_beta (`float`, defaults to `1.0`): SRPO: β ≥ 0 of the weights exp(−β H_teacher) (normalised to
        mean 1 over the distillation tokens); 0 = uniform weights.
    srpo_distill_topk (`int`, defaults to `100`): SRPO: k of the teacher's top-k support of the divergence.
    srpo_distill_alpha (`float`, defaults to `0.5`): SRPO: α ∈ [0, 1] of SDPO's divergence (0.5 = Jensen-Shannon,
        0 forward KL, 1 reverse KL).
    srpo_distill_add_tail (`bool`, defaults to `True`): SRPO: one extra bucket for the mass outside the top-k
        (False: renormalise on the top-k). Choice (verl-recipe SDPO's default; TRL's SDPO defaults to False).
    srpo_teacher_kind (`str`, defaults to `"ema"`): SRPO: self-teacher weights, `"ema"` (SDPO's), `"live"` (the
        current policy) or `"base"` (the initial policy).
    srpo_teacher_update_rate (`float`, defaults to `0.05`): SRPO: EMA rate of the `"ema"` teacher per step.
    """

    loss_aggregation: str | None = field(
        default=None,
        metadata={"help": f"Normaliser for trl_groupx objectives, one of {AGGREGATIONS}; None = paper default."},
    )
    balanced_agg_scope: str = field(
        default="group", metadata={"help": "Balanced aggregation: sign classes per 'group' or over the 'batch'."}
    )
    kl_estimator: str = field(
        default="k3",
        metadata={"help": "KL penalty estimator: k3 (TRL's), k1, k2 or abs; applies when beta > 0."},
    )
    beta_negative: float | None = field(
        default=None,
        metadata={"help": "KL coefficient where the advantage is negative (MDP-GRPO: 0.025, beta = 0.01); None = beta."},
    )
    # gmpo
    gmpo_clip: float = field(default=0.4, metadata={"help": "GMPO: log-space clip c of each token log-ratio."})
    # holderpo
    holderpo_p_start: float = field(default=2.0, metadata={"help": "HolderPO: power p of the ratio mean at step 0."})
    holderpo_p_end: float = field(default=-2.0, metadata={"help": "HolderPO: p at the end of the schedule."})
    holderpo_schedule_steps: int = field(default=500, metadata={"help": "HolderPO: linear p schedule length (steps)."})
    holderpo_schedule: str = field(
        default="linear", metadata={"help": "HolderPO: 'linear' (p_start -> p_end) or 'constant' (p = p_start)."}
    )
    # dual_clip
    dual_clip_c: float = field(default=3.0, metadata={"help": "Dual-clip PPO: ratio cap c > 1 for A < 0 tokens."})
    # clip_cov
    clip_cov_ratio: float = field(default=2e-4, metadata={"help": "Clip-Cov: fraction of tokens cut."})
    clip_cov_lb: float = field(default=1.0, metadata={"help": "Clip-Cov: covariance window lower bound."})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "Clip-Cov: covariance window upper bound."})
    # kl_cov
    kl_cov_ratio: float = field(default=2e-3, metadata={"help": "KL-Cov: fraction of tokens penalised."})
    kl_cov_coef: float = field(default=1.0, metadata={"help": "KL-Cov: weight of the |log ratio| penalty."})
    # dppo_tv
    dppo_tv_delta: float = field(default=0.15, metadata={"help": "DPPO-TV: trust-region radius on |p - p_old|."})
    dppo_tv_is_cap: float = field(default=10000.0, metadata={"help": "DPPO-TV: cap of the detached IS weight."})
    # dro
    dro_beta: float | None = field(
        default=None, metadata={"help": "DRO: weight of the quadratic log-ratio penalty (required, e.g. 0.05)."}
    )
    # dppo_kl
    dppo_kl_delta: float = field(default=0.05, metadata={"help": "DPPO-KL: trust-region radius on the binary KL."})
    dppo_kl_is_cap: float = field(default=10000.0, metadata={"help": "DPPO-KL: cap of the detached IS weight."})
    # ctpo
    ctpo_clip_low: float = field(default=0.025, metadata={"help": "CTPO: log-space lower clip base (x t**power)."})
    ctpo_clip_high: float = field(default=0.05, metadata={"help": "CTPO: log-space upper clip base (x t**power)."})
    ctpo_clip_c: float = field(default=0.05, metadata={"help": "CTPO: log-space dual-clip base (x t**power)."})
    ctpo_power: float = field(default=0.5, metadata={"help": "CTPO: position-scaling exponent p of t**p."})
    ctpo_ratio_mode: str = field(default="cumprod", metadata={"help": "CTPO: 'cumprod' or 'geomean' prefix ratio."})
    # dhpo
    dhpo_mix_weight: float = field(default=0.5, metadata={"help": "DHPO: weight of the token ratio (1-w: sequence)."})
    dhpo_mix_mean: str = field(default="arithmetic", metadata={"help": "DHPO: 'arithmetic' or 'geometric' ratio mix."})
    dhpo_seq_epsilon: float = field(default=3e-4, metadata={"help": "DHPO: sequence-branch lower clip width."})
    dhpo_seq_epsilon_high: float = field(default=4e-4, metadata={"help": "DHPO: sequence-branch upper clip width."})
    # offpolicy_grpo
    offpolicy_grpo_lag: int = field(default=10, metadata={"help": "Off-policy GRPO: optimizer steps per sync."})
    # gvpo
    gvpo_beta: float = field(default=0.1, metadata={"help": "GVPO: beta of the implicit reward beta*log(pi/pi_old)."})
    # thinkless
    thinkless_alpha: float = field(default=0.001, metadata={"help": "Thinkless/DeGRPO: weight of the control-token loss."})
    # hapo_clip
    hapo_clip_alpha: float = field(default=1.0, metadata={"help": "HAPO clip: alpha of the entropy-adaptive bounds."})
    hapo_clip_entropy_pivot: float = field(default=0.8, metadata={"help": "HAPO clip: entropy pivot quantile."})
    hapo_clip_c: float = field(default=10.0, metadata={"help": "HAPO clip: dual-clip ratio cap c > 1 for A < 0."})
    hapo_clip_official_sign: bool = field(
        default=False, metadata={"help": "HAPO clip: official unsigned entropy score |h_hat| instead of the paper's."}
    )
    # fiberpo
    fiberpo_epsilon: float = field(default=0.05, metadata={"help": "FiberPO: fibre band half-width on token residuals."})
    fiberpo_c_pos: float = field(default=0.28, metadata={"help": "FiberPO: trajectory budget on mean upward log-ratio."})
    fiberpo_c_neg: float = field(default=0.2, metadata={"help": "FiberPO: trajectory budget on mean downward log-ratio."})
    fiberpo_rollback_slope: float = field(
        default=1.0, metadata={"help": "FiberPO: slope -k of the trajectory gate beyond its budget (1 = reflection)."}
    )
    # dgrpo
    opd_teacher_model: str | None = field(
        default=None, metadata={"help": "dGRPO: teacher model id or path (same tokenizer as the student)."}
    )
    opd_coef: float = field(default=1.0, metadata={"help": "dGRPO: weight of the distillation (reverse KL) term."})
    # lightningrl
    lightningrl_nll_coef: float = field(
        default=0.1, metadata={"help": "LightningRL: weight of the NLL on correct rollouts (0 = policy loss only)."}
    )
    lightningrl_nll_threshold: float = field(
        default=1.0, metadata={"help": "LightningRL: a rollout whose total reward is >= this counts as correct."}
    )
    lightningrl_nll_reduction: str = field(
        default="token", metadata={"help": "LightningRL: 'token' (mean over correct tokens) or 'sequence'."}
    )
    # srpo
    srpo_success_threshold: float = field(
        default=1.0, metadata={"help": "SRPO: a rollout whose total reward is >= this counts as correct."}
    )
    srpo_entropy_beta: float = field(default=1.0, metadata={"help": "SRPO: beta of the weights exp(-beta H_teacher)."})
    srpo_distill_topk: int = field(default=100, metadata={"help": "SRPO: k of the teacher's top-k support."})
    srpo_distill_alpha: float = field(default=0.5, metadata={"help": "SRPO: divergence alpha (0.5 = Jensen-Shannon)."})
    srpo_distill_add_tail: bool = field(
        default=True, metadata={"help": "SRPO: add a bucket for the mass outside the top-k (else renormalise)."}
    )
    srpo_teacher_kind: str = field(default="ema", metadata={"help": "SRPO: self-teacher 'ema', 'live' or 'base'."})
    srpo_teacher_update_rate: float = field(default=0.05, metadata={"help": "SRPO: EMA rate of the 'ema' teacher."})
