"""Advantage-stage fields of `trl_groupx.GRPOConfig`: the selector, then one block per variant's hyper-parameters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdvantageArgs:
    """
    advantage_estimator (`str`, *optional*, defaults to `"grpo"`):
        Advantage-stage variant. `"grpo"` keeps TRL's computation (`scale_rewards`, `multi_objective_aggregation`).
    softmax_grpo_temperature (`float`, *optional*, defaults to `0.3`):
        `softmax_grpo`: temperature τ of `A = G·softmax(r/τ) − 1` (paper 0.3; 0.1 on GSM8K/Countdown).
    focal_tailmiss_gamma (`float`, *optional*, defaults to `0.5`):
        `focal_tailmiss`: focal exponent γ ≥ 0 of the group weight `(1 − p̂)^γ` (paper 0.5; 0 = plain GRPO).
    focal_tailmiss_success_threshold (`float` or `None`, *optional*, defaults to `None`):
        `focal_tailmiss`: `None` → rewards in [0, 1] and p̂ = group mean reward; a number → p̂ = fraction of the group
        with reward ≥ threshold.
    grpo_passk_norm_by_std (`bool`, *optional*, defaults to `True`):
        `grpo_passk`: divide the best rollout's margin `r_max − r_second` by the group std (+1e-6), as verl's
        `norm_adv_by_std_in_grpo`.
    std_dial_mode (`str`, *optional*, defaults to `"divide"`):
        `std_dial`: `"divide"` (GRPO, = TRL `scale_rewards="group"`) or `"none"` (Dr. GRPO, = `scale_rewards="none"`).

    > mathforge_dgpo
    mathforge_dgpo_dqw (`bool`, defaults to `True`): MathForge DGPO: apply difficulty-aware question weighting (DQW)
        on top of the difficulty-balanced advantages; `False` gives DGAE alone.
    mathforge_dgpo_dqw_temperature (`float`, defaults to `2.0`): MathForge DGPO: DQW softmax temperature `T > 0`
        in `λ_q = M·softmax(−acc_q / T)` (official scripts: 2.0).

    > gd2po
    gd2po_conflict_threshold (`float`, defaults to `0.8`): GD²PO: a rollout whose per-reward advantages have mixed
        signs is dropped when its consensus ratio `|Σ_k z_k| / Σ_k |z_k|` is below this; in `[0, 1]`, 1.0 drops every
        sign conflict (official "hard" estimator), 0.8 is the official "snr" script, 0 keeps all.

    > dvao
    dvao_variance_power (`float`, defaults to `2.0`): DVAO: per-group weight of reward `k` is `∝ c_k σ_gk^p` with
        `σ_gk` its within-group std; 2.0 weights by variance (the abstract's word), 1.0 by std. Must be > 0.

    > ebpo
    ebpo_scale_rewards (`str`, defaults to `"batch"`): EBPO: divide the shrinkage-baselined advantages by the batch
        reward std (+1e-4; the running global std when the batch has no spread) (`"batch"`, the paper's
        batch-level normalisation) or not at all (`"none"`).
    """

    advantage_estimator: str = field(
        default="grpo", metadata={"help": "Advantage-stage variant id; 'grpo' keeps TRL's own computation."}
    )

    # softmax_grpo
    softmax_grpo_temperature: float = field(
        default=0.3, metadata={"help": "softmax_grpo: temperature tau of A = G*softmax(r/tau) - 1 (paper 0.3)."}
    )

    # focal_tailmiss
    focal_tailmiss_gamma: float = field(
        default=0.5, metadata={"help": "focal_tailmiss: focal exponent gamma of (1 - p_hat)^gamma (paper 0.5)."}
    )
    focal_tailmiss_success_threshold: float | None = field(
        default=None,
        metadata={"help": "focal_tailmiss: None -> p_hat = group mean reward (rewards in [0,1]); else reward >= t."},
    )

    # grpo_passk
    grpo_passk_norm_by_std: bool = field(
        default=True, metadata={"help": "grpo_passk: divide the best rollout's margin by the group std (verl)."}
    )

    # std_dial
    std_dial_mode: str = field(
        default="divide", metadata={"help": "std_dial: 'divide' (GRPO) or 'none' (Dr. GRPO) the group std."}
    )
    # mathforge_dgpo
    mathforge_dgpo_dqw: bool = field(default=True, metadata={"help": "MathForge DGPO: apply question weighting (DQW)."})
    mathforge_dgpo_dqw_temperature: float = field(
        default=2.0, metadata={"help": "MathForge DGPO: DQW softmax temperature T (paper: 2.0)."}
    )
    # gd2po
    gd2po_conflict_threshold: float = field(
        default=0.8, metadata={"help": "GD2PO: drop sign-conflicting rollouts whose consensus ratio is below this."}
    )
    # dvao
    dvao_variance_power: float = field(
        default=2.0, metadata={"help": "DVAO: per-group reward weights proportional to within-group std**p."}
    )
    # ebpo
    ebpo_scale_rewards: str = field(
        default="batch", metadata={"help": "EBPO: 'batch' (divide by the batch reward std) or 'none'."}
    )
