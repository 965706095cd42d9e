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

    > aapo
    aapo_clip_low, aapo_clip_high (`float`, defaults to `0.2`, `0.28`): AAPO: the margin `r − r_ref` over a reference
        sample is clipped to `[−low, high]` (official values).
    aapo_coef (`float`, defaults to `1.0`): AAPO: weight of the clipped margin added to the group-centred advantage
        (ours; 1 = official, 0 = GRPO).
    aapo_scale_rewards (`bool`, defaults to `False`): AAPO: divide the group-centred part by the group std + 1e-4
        (official `--scale_rewards`, off in the 7B scripts).

    > ccpo (two-agent counterfactual credit; `step_modules` + `counterfactual_completion_ids` from the rollout_func)
    ccpo_lambda (`float`, defaults to `0.2`): CCPO: weight λ of the counterfactual bonus added to the credited
        agent's reward (official `counterfactual_lambda`).
    ccpo_credit (`str`, defaults to `"event"`): CCPO: `"event"` (official: bonus ±1 when the team outcome and the
        solo baseline disagree in sign), `"delta"` (official `counterfactual_use_event_bonus=False`: bonus
        `(o − b)/2`) or `"marginal"` (the abstract: the credited agent's reward is `o − b`, λ unused).
    ccpo_solo_baseline (`str`, defaults to `"group"`): CCPO: `b` is the mean counterfactual outcome of the prompt
        group (`"group"`, official) or the episode's own (`"row"`).
    ccpo_outcome (`str`, defaults to `"sign"`): CCPO: `"sign"` maps rewards to the verifier outcome ±1 (> 0 → +1,
        official) before the credit; `"raw"` uses the run's rewards as they are.
    ccpo_scale (`bool`, defaults to `False`): CCPO: divide each agent's group-centred reward by its group std + 1e-6
        (official `norm_adv_by_std_in_grpo=False`).
    ccpo_credited_agent (`str`, defaults to `"thinker"`): CCPO: the `step_modules` name of the agent that gets the
        counterfactual credit (official: the Thinker); every other turn gets the team reward's advantage.

    > mc_grpo
    mc_grpo_scale (`str`, defaults to `"mad"`): MC-GRPO: divide `r − median` by the group's median absolute
        deviation + 1e-3 (`"mad"`, the official code) or not (`"none"`); with binary rewards MAD is 0, see the docstring.

    > dvao
    dvao_variance_power (`float`, defaults to `2.0`): DVAO: per-group weight of reward `k` is `∝ c_k σ_gk^p` with
        `σ_gk` its within-group std; 2.0 weights by variance (the abstract's word), 1.0 by std. Must be > 0.

    > ebpo
    ebpo_scale_rewards (`str`, defaults to `"batch"`): EBPO: divide the shrinkage-baselined advantages by the batch
        reward std (+1e-4; the running global std when the batch has no spread) (`"batch"`, the paper's
        batch-level normalisation) or not at all (`"none"`).

    > spo_single
    spo_single_rho (`float`, defaults to `0.875`): SPO: forgetting factor ρ of the per-prompt tracker,
        `α ← ρα + Σr`, `β ← ρβ + Σ(1−r)` once per visit, in [0, 1] (official constant-ρ value and the lower clip of
        its KL-adaptive rule; the adaptive ρ needs past-visit log-probs the advantage stage does not have).
    spo_single_init (`str`, defaults to `"prior"`): SPO: a new prompt starts at `α = β = 0.5` (`"prior"`, official
        offline_N=0) or from its first group with the official offline formula (`"first_group"`).
    spo_single_batch_norm (`bool`, defaults to `True`): SPO: normalise `r − v̂(x)` over the batch,
        `(A − mean)/(std + 1e-8)` (official), or return it raw.
    spo_single_rho_mode (`str`, defaults to `"constant"`): SPO: `"constant"` (ρ = `spo_single_rho`) or `"kl"`
        (official default rule: `ρ = clip(2^(−D/spo_single_kl_half_life), spo_single_rho_min, spo_single_rho_max)`
        with D the prompt's mean |Δ log-prob| since its last visit; two extra no-grad forwards per batch).
    spo_single_kl_half_life (`float`, defaults to `0.06`): SPO: the D at which the KL rule gives ρ = 1/2.
    spo_single_rho_min (`float`, defaults to `0.875`), spo_single_rho_max (`float`, defaults to `0.96`): SPO: clip
        of the KL-adaptive ρ (official clip_lower and its fixed upper bound).

    > mdp_grpo
    mdp_grpo_alpha (`float`, defaults to `0.2`): MDP-GRPO: weight α of the goal anchor in
        `A = (1−α)·PT(z) + α·PT(δ)`, in [0, 1] (official scripts 0.2).
    mdp_grpo_num_constraints (`float`, defaults to `1.0`): MDP-GRPO: constraints per prompt `C ≥ 1` in the goal std
        `sqrt(G/(4C))` (the official code reads it per prompt from a dataset column; here one value per run).
    mdp_grpo_goal_mode (`str`, defaults to `"max_half_and_group_mean"`): MDP-GRPO: goal-anchor mean,
        `max(0.5, group mean)` (official default), `"half"` (paper's fixed 0.5) or `"group_mean"`.
    mdp_grpo_prospect (`bool`, defaults to `True`): MDP-GRPO: apply the prospect-theoretic shaping to both anchors.
    mdp_grpo_prospect_beta (`float`, defaults to `0.8`): MDP-GRPO: β_PT in `λ·tanh(β_PT·v)`.
    mdp_grpo_lambda_pos (`float`, defaults to `1.25`): MDP-GRPO: λ+ for non-negative anchors (paper/config
        default; the shipped script uses 2.0).
    mdp_grpo_lambda_neg (`float`, defaults to `2.0`): MDP-GRPO: λ− for negative anchors, > λ+ for loss aversion
        (the shipped script uses 1.25).

    > gpg_valid_rescale
    gpg_valid_rescale_min_inverse_alpha (`float`, defaults to `0.5`): GPG: floor of the valid-group fraction
        `(B − M)/B`, so the rescale `α = B/(B − M)` is at most `1/0.5 = 2` (official resampling threshold 0.5; the
        resampling loop itself is not provided). In (0, 1].
    gpg_valid_rescale_scale_rewards (`bool`, defaults to `False`): GPG: also divide by the group std + 1e-4
        (official `--scale_rewards`, off in the official scripts).

    > papo (reads two reward functions: `reward_funcs[papo_outcome_reward_index]` the outcome verifier,
    `reward_funcs[papo_process_reward_index]` the process reward model / judge; at least two are required)
    papo_outcome_reward_index (`int`, defaults to `0`): PAPO: position of the outcome verifier in `reward_funcs`.
    papo_process_reward_index (`int`, defaults to `1`): PAPO: position of the process reward model (rubric judge)
        in `reward_funcs`; must differ from the outcome index.
    papo_process_weight (`float`, defaults to `1.0`): PAPO: λ ≥ 0 in `A = A_out + λ·A_proc` (official 1.0; 0.6 in
        the Qwen2.5-7B script; 0 is plain GRPO).
    papo_correct_threshold (`float`, defaults to `1.0`): PAPO: a response is correct (enters the process
        normalisation) when its outcome reward is ≥ this (official: `== 1.0` for a 0/1 verifier).

    > verigate (reads two reward functions, like papo: the verifier and the process reward model)
    verigate_outcome_reward_index (`int`, defaults to `0`): VeriGate: position of the verifier in `reward_funcs`.
    verigate_process_reward_index (`int`, defaults to `1`): VeriGate: position of the process reward model in
        `reward_funcs`, read only in groups whose verifier rewards are all equal; must differ from the verifier's.

    > allneg_aifeedback (SGPO: a step-wise judge re-scores the groups whose responses are all wrong)
    allneg_aifeedback_judge (`str` or `None`, defaults to `None`): SGPO: registered name of the judge
        (`register_allneg_judge`; built in: `"arithmetic_prefix"`, the toy task's correct-prefix share); required.
    allneg_aifeedback_fail_threshold (`float`, defaults to `0.0`): SGPO: a response is wrong when its reward is
        ≤ this; a group of wrong responses only is judged (0.0 for a 0/1 verifier).

    > dagrpo (DaGRPO: near-identical response pairs with opposite advantages are masked)
    dagrpo_scorer (`str` or `None`, defaults to `None`): DaGRPO: registered name of the distinctiveness scorer
        (`register_dagrpo_scorer`; built in: `"token_jaccard"`, token-id set overlap); required.
    dagrpo_similarity_threshold (`float`, defaults to `0.9`): DaGRPO: a pair of a group with similarity ≥ this and
        advantages of opposite signs is indistinct; both rows leave the update. In `(0, 1]`.

    > agentflow, gigpo, hgpo (multi-turn step credit; per-step data from the rollout, see `advantages/step_credit.py`)
    agentflow_episode_stats (`str`, defaults to `"trajectory"`): Flow-GRPO: group statistics over episodes
        (`"trajectory"`, the paper's formula) or over turn rows (`"steps"`, the official verl code: long episodes
        weigh more).
    agentflow_scale (`bool`, defaults to `True`): Flow-GRPO: divide by the group std + 1e-6.
    gigpo_gamma (`float`, defaults to `0.95`): GiGPO: discount γ of the step returns (official recipes 0.95).
    gigpo_step_advantage_w (`float`, defaults to `1.0`): GiGPO: weight ω of the step-level advantage in
        `A = A^E + ω A^S`.
    gigpo_mode (`str`, defaults to `"mean_std_norm"`): GiGPO: `"mean_std_norm"` (divide by the unbiased std + 1e-6)
        or `"mean_norm"` (mean only).
    gigpo_episode_stats (`str`, defaults to `"trajectory"`): GiGPO: episode-level statistics over episodes (paper
        Eq. 3) or over step rows (`"steps"`, official `compute_mean_std_cross_steps=True`).
    hgpo_gamma (`float`, defaults to `0.95`): HGPO: discount γ of the step returns (official recipe 0.95).
    hgpo_history_length (`int`, defaults to `2`): HGPO: history depth H; levels k = 1 … H + 1 (official 2 or 4).
    hgpo_mode (`str`, defaults to `"mean_std_norm"`): HGPO: divide by the population std + 1e-6, or mean only.
    hgpo_length_weight_alpha (`float`, defaults to `1.0`): HGPO: level weight `(k + 1)^α`.
    hgpo_base_group (`bool`, defaults to `False`): HGPO: add the episode-level advantage as level k = 0.
    hgpo_episode_stats (`str`, defaults to `"steps"`): HGPO: statistics of the base group (official: step rows).
    graphgpo_gamma (`float`, defaults to `0.1`): GraphGPO: step return `10·γ^d(s')` from the graph distance of the
        next state to the goal, in (0, 1] (official recipe 0.10).
    graphgpo_step_advantage_w (`float`, defaults to `1.0`): GraphGPO: weight of the graph step advantage.
    graphgpo_episode_advantage_w (`float`, defaults to `1.0`): GraphGPO: weight of the episode-level advantage.
    graphgpo_mode (`str`, defaults to `"mean_std_norm"`): GraphGPO: divide by the unbiased std + 1e-6, or
        `"mean_norm"` (mean only).
    graphgpo_episode_stats (`str`, defaults to `"trajectory"`): GraphGPO: episode-level statistics over episodes
        (as `gigpo`) or over step rows (`"steps"`, the official code).
    graphgpo_normalize_distance (`bool`, defaults to `False`): GraphGPO: step return `10·γ^(d(s') − d(s) + 1)`
        (progress) instead of `10·γ^d(s')` (official option, off in the recipe).
    graphgpo_success_threshold (`float`, defaults to `0.0`): GraphGPO: an episode whose reward is above this
        reached the goal (official: `episode_rewards > 0`).
    gagpo_gamma (`float`, defaults to `0.95`): GAGPO: discount γ of the returns and of the TD residuals.
    gagpo_lambda (`float`, defaults to `0.95`): GAGPO: GAE λ in [0, 1] (1: return − V, 0: TD(0) residual).
    gagpo_norm (`str`, defaults to `"mean_std"`): GAGPO: normalise the step advantages over the prompt group's
        steps, `"mean"` (centre only) or `"none"`.
    gagpo_reward_source (`str`, defaults to `"outcome"`): GAGPO: the episode reward on the last step (`"outcome"`)
        or the environment's step rewards (`"steps"`).
    mmgrpo_grouping (`str`, defaults to `"truncate"`): mmGRPO: which LM calls form the groups when rollouts call a
        module different numbers of times: `"truncate"` (dspy's default: only the first `min` calls of the module,
        over the prompt's scored rollouts, are trained; a module some rollout never called is not trained for that
        prompt) or `"ragged"` (the j-th call of a module is grouped with the rollouts that made a j-th call; the
        official `ragged` mode crashes on that case, see `advantages/mmgrpo.py`).
    mmgrpo_scale (`bool`, defaults to `False`): mmGRPO: divide by the group's unbiased std + 1e-4 (Arbor
        `scale_rewards`, default off: Dr.GRPO-style centring only).

    > sppo (one rollout per prompt allowed: `num_generations=1`; rewards in [0, 1])
    sppo_value_model (`str` or `None`, defaults to `None`): SPPO: model id or local path of the value model `V(x)`, a
        causal LM with the policy's tokenizer given a scalar head (official: the policy's own checkpoint, or a smaller
        model of its family); required when `advantage_estimator="sppo"`.
    sppo_value_lr (`float`, defaults to `5e-6`): SPPO: the value model's AdamW learning rate (official
        `critic.optim.lr` 5e-6; betas, weight decay 0.01 and clip 1.0 are the official constants).
    sppo_value_mini_batch_size (`int` or `None`, defaults to `None`): SPPO: rows of the global generation batch per
        value-model step; `None` = the whole batch, one step per generation batch (official 128 of 256: two).
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
    mc_grpo_scale: str = field(
        default="mad", metadata={"help": "MC-GRPO: 'mad' (divide by MAD + 1e-3, official code) or 'none'."}
    )
    dvao_variance_power: float = field(
        default=2.0, metadata={"help": "DVAO: per-group reward weights proportional to within-group std**p."}
    )
    # ebpo
    ebpo_scale_rewards: str = field(
        default="batch", metadata={"help": "EBPO: 'batch' (divide by the batch reward std) or 'none'."}
    )
    # spo_single
    spo_single_rho: float = field(
        default=0.875, metadata={"help": "SPO: tracker forgetting factor rho in [0, 1] (official constant 0.875)."}
    )
    spo_single_init: str = field(
        default="prior", metadata={"help": "SPO: new prompts start at alpha=beta=0.5 ('prior') or 'first_group'."}
    )
    spo_single_batch_norm: bool = field(
        default=True, metadata={"help": "SPO: normalise r - v_hat over the batch, (A - mean)/(std + 1e-8)."}
    )
    spo_single_rho_mode: str = field(
        default="constant", metadata={"help": "SPO: 'constant' (spo_single_rho) or 'kl' (official adaptive rho)."}
    )
    spo_single_kl_half_life: float = field(
        default=0.06, metadata={"help": "SPO kl rho: half-life h of 2^(-D/h) (official 0.06)."}
    )
    spo_single_rho_min: float = field(default=0.875, metadata={"help": "SPO kl rho: lower clip (official 0.875)."})
    spo_single_rho_max: float = field(default=0.96, metadata={"help": "SPO kl rho: upper clip (official 0.96)."})
    # mdp_grpo
    mdp_grpo_alpha: float = field(default=0.2, metadata={"help": "MDP-GRPO: goal-anchor weight alpha (0.2)."})
    mdp_grpo_num_constraints: float = field(
        default=1.0, metadata={"help": "MDP-GRPO: constraints per prompt C in the goal std sqrt(G/(4C))."}
    )
    mdp_grpo_goal_mode: str = field(
        default="max_half_and_group_mean",
        metadata={"help": "MDP-GRPO: goal mean 'max_half_and_group_mean', 'half' or 'group_mean'."},
    )
    mdp_grpo_prospect: bool = field(default=True, metadata={"help": "MDP-GRPO: prospect-theoretic shaping."})
    mdp_grpo_prospect_beta: float = field(default=0.8, metadata={"help": "MDP-GRPO: beta_PT (0.8)."})
    mdp_grpo_lambda_pos: float = field(default=1.25, metadata={"help": "MDP-GRPO: lambda+ (1.25)."})
    mdp_grpo_lambda_neg: float = field(default=2.0, metadata={"help": "MDP-GRPO: lambda- (2.0, loss aversion)."})
    # aapo
    aapo_clip_low: float = field(default=0.2, metadata={"help": "AAPO: lower clip of the reference margin (0.2)."})
    aapo_clip_high: float = field(default=0.28, metadata={"help": "AAPO: upper clip of the reference margin (0.28)."})
    aapo_coef: float = field(default=1.0, metadata={"help": "AAPO: weight of the clipped margin (1; 0 = GRPO)."})
    aapo_scale_rewards: bool = field(
        default=False, metadata={"help": "AAPO: divide the group-centred part by std + 1e-4 (official 7B: False)."}
    )
    # gpg_valid_rescale
    gpg_valid_rescale_min_inverse_alpha: float = field(
        default=0.5, metadata={"help": "GPG: floor of the valid-group fraction; alpha = B/(B-M) <= 1/this (0.5)."}
    )
    gpg_valid_rescale_scale_rewards: bool = field(
        default=False, metadata={"help": "GPG: also divide by the group std + 1e-4 (official default False)."}
    )
    # agentflow
    agentflow_episode_stats: str = field(
        default="trajectory", metadata={"help": "Flow-GRPO: group stats over 'trajectory' (paper) or 'steps' (code)."}
    )
    agentflow_scale: bool = field(default=True, metadata={"help": "Flow-GRPO: divide by the group std + 1e-6."})
    # gigpo
    gigpo_gamma: float = field(default=0.95, metadata={"help": "GiGPO: discount of the step returns (0.95)."})
    gigpo_step_advantage_w: float = field(default=1.0, metadata={"help": "GiGPO: weight of the step advantage."})
    gigpo_mode: str = field(default="mean_std_norm", metadata={"help": "GiGPO: 'mean_std_norm' or 'mean_norm'."})
    gigpo_episode_stats: str = field(
        default="trajectory", metadata={"help": "GiGPO: episode stats over 'trajectory' (paper) or 'steps' (code)."}
    )
    # hgpo
    hgpo_gamma: float = field(default=0.95, metadata={"help": "HGPO: discount of the step returns (0.95)."})
    hgpo_history_length: int = field(default=2, metadata={"help": "HGPO: history depth H (levels 1..H+1)."})
    hgpo_mode: str = field(default="mean_std_norm", metadata={"help": "HGPO: 'mean_std_norm' or 'mean_norm'."})
    hgpo_length_weight_alpha: float = field(default=1.0, metadata={"help": "HGPO: level weight (k+1)**alpha."})
    hgpo_base_group: bool = field(default=False, metadata={"help": "HGPO: add the episode level as k = 0."})
    hgpo_episode_stats: str = field(
        default="steps", metadata={"help": "HGPO: base-group stats over 'steps' (code) or 'trajectory'."}
    )
    # graphgpo
    graphgpo_gamma: float = field(default=0.1, metadata={"help": "GraphGPO: step return 10*gamma**d(next) (0.10)."})
    graphgpo_step_advantage_w: float = field(default=1.0, metadata={"help": "GraphGPO: weight of the step advantage."})
    graphgpo_episode_advantage_w: float = field(
        default=1.0, metadata={"help": "GraphGPO: weight of the episode advantage."}
    )
    graphgpo_mode: str = field(default="mean_std_norm", metadata={"help": "GraphGPO: 'mean_std_norm' or 'mean_norm'."})
    graphgpo_episode_stats: str = field(
        default="trajectory", metadata={"help": "GraphGPO: episode stats over 'trajectory' or 'steps' (code)."}
    )
    graphgpo_normalize_distance: bool = field(
        default=False, metadata={"help": "GraphGPO: return 10*gamma**(d(next) - d(state) + 1) instead."}
    )
    graphgpo_success_threshold: float = field(
        default=0.0, metadata={"help": "GraphGPO: episode reward above this reached the goal (0.0)."}
    )
    # gagpo
    gagpo_gamma: float = field(default=0.95, metadata={"help": "GAGPO: discount of returns and TD residuals."})
    gagpo_lambda: float = field(default=0.95, metadata={"help": "GAGPO: GAE lambda (1: return - V, 0: TD(0))."})
    gagpo_norm: str = field(default="mean_std", metadata={"help": "GAGPO: 'mean_std', 'mean' or 'none' per group."})
    gagpo_reward_source: str = field(
        default="outcome", metadata={"help": "GAGPO: episode reward on the last step ('outcome') or 'steps'."}
    )
    # mmgrpo
    mmgrpo_grouping: str = field(
        default="truncate", metadata={"help": "mmGRPO: 'truncate' (dspy default) or 'ragged' variable-call groups."}
    )
    mmgrpo_scale: bool = field(default=False, metadata={"help": "mmGRPO: divide by the group std + 1e-4 (Arbor off)."})
    # papo
    papo_outcome_reward_index: int = field(
        default=0, metadata={"help": "PAPO: position of the outcome verifier in reward_funcs (0)."}
    )
    papo_process_reward_index: int = field(
        default=1, metadata={"help": "PAPO: position of the process reward model / judge in reward_funcs (1)."}
    )
    papo_process_weight: float = field(default=1.0, metadata={"help": "PAPO: lambda in A_out + lambda*A_proc (1.0)."})
    papo_correct_threshold: float = field(
        default=1.0, metadata={"help": "PAPO: correct = outcome reward >= this (1.0 for a 0/1 verifier)."}
    )
    # verigate
    verigate_outcome_reward_index: int = field(
        default=0, metadata={"help": "VeriGate: position of the verifier in reward_funcs (0)."}
    )
    verigate_process_reward_index: int = field(
        default=1, metadata={"help": "VeriGate: position of the process reward model in reward_funcs (1)."}
    )
    # allneg_aifeedback
    allneg_aifeedback_judge: str | None = field(
        default=None, metadata={"help": "SGPO: registered name of the step judge of all-negative groups (required)."}
    )
    allneg_aifeedback_fail_threshold: float = field(
        default=0.0, metadata={"help": "SGPO: a response is wrong when its reward is <= this (0.0)."}
    )
    # dagrpo
    dagrpo_scorer: str | None = field(
        default=None, metadata={"help": "DaGRPO: registered name of the pairwise distinctiveness scorer (required)."}
    )
    dagrpo_similarity_threshold: float = field(
        default=0.9, metadata={"help": "DaGRPO: a pair with similarity >= this and opposite advantages is masked."}
    )
    # ccpo
    ccpo_lambda: float = field(default=0.2, metadata={"help": "CCPO: weight of the counterfactual bonus (0.2)."})
    ccpo_credit: str = field(
        default="event", metadata={"help": "CCPO: 'event' (official), 'delta' or 'marginal' (abstract)."}
    )
    ccpo_solo_baseline: str = field(
        default="group", metadata={"help": "CCPO: counterfactual baseline 'group' mean (official) or 'row'."}
    )
    ccpo_outcome: str = field(
        default="sign", metadata={"help": "CCPO: 'sign' verifier outcome +-1 (official) or 'raw' rewards."}
    )
    ccpo_scale: bool = field(default=False, metadata={"help": "CCPO: divide by the group std + 1e-6 (official off)."})
    ccpo_credited_agent: str = field(
        default="thinker", metadata={"help": "CCPO: step_modules name of the agent given the counterfactual credit."}
    )
    # sppo
    sppo_value_model: str | None = field(
        default=None, metadata={"help": "SPPO: value model V(x) (the policy's tokenizer; official: the policy)."}
    )
    sppo_value_lr: float = field(default=5e-6, metadata={"help": "SPPO: value model's AdamW learning rate (5e-6)."})
    sppo_value_mini_batch_size: int | None = field(
        default=None, metadata={"help": "SPPO: rows per value-model step (None: one step per generation batch)."}
    )
