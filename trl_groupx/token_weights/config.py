"""Token-weight-stage fields of `trl_groupx.GRPOConfig`: the selector, then one block per variant."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenWeightArgs:
    """
    token_weighting (`str` or `None`, *optional*, defaults to `None`):
        Token-weight-stage variant turning sequence advantages into per-token advantages, or `None`.

    > gtpo_entropy
    gtpo_level (`str`, defaults to `"token"`): `"token"` (GTPO) or `"sequence"` (GRPO-S).
    gtpo_alpha1 (`float`, defaults to `1.0`): GTPO α1 / GRPO-S β1, the outcome term.
    gtpo_alpha2 (`float`, defaults to `0.1`): GTPO α2 / GRPO-S β2, the entropy term.
    gtpo_normalization (`str`, defaults to `"separate"`): GTPO Eq. 6: `"separate"` z-scores the tokens of successful
        and failed completions apart; `"joint"` uses one z-score over all tokens.
    gtpo_success_threshold (`float`, defaults to `0.0`): a completion is successful when its reward exceeds it.

    > frpo
    frpo_beta (`float`, defaults to `0.01`): β of the future-KL return-to-go subtracted from the advantage.

    > wapo
    wapo_positive_group_scale (`bool`, defaults to `True`): multiply the kept advantages by
        #groups / #groups-with-a-positive-completion, which turns `loss_type="dr_grpo"` into WAPO's official
        normaliser `Σ / (G · max_len · #positive groups)`.

    > stapo
    stapo_prob_threshold (`float`, defaults to `0.002`): τ_p; a positive-advantage token with rollout probability
        below it is a spurious candidate.
    stapo_entropy_quantile (`float`, defaults to `0.75`): q; candidates with entropy below the q-quantile of the
        candidates' entropies (over the batch) are masked.
    stapo_renormalize (`str`, defaults to `"token"`): `"token"` (global token-mean losses such as dapo/cispo),
        `"sequence"` (sequence-mean losses such as grpo) or `"none"`: remove the masked tokens from the normaliser.

    > edge_grpo
    edge_grpo_eps (`float`, defaults to `1e-6`): lower bound on a completion's mean entropy in EDA's division.

    > mu_grpo
    mu_grpo_veto_trigger (`str`, defaults to `"low_prob"`): what starts the veto in a negative-advantage completion
        (the paper's criterion is not public): `"low_prob"` (rollout probability below the threshold) or
        `"high_entropy"` (entropy above the threshold).
    mu_grpo_veto_threshold (`float`, defaults to `0.01`): the trigger's probability (low_prob) or entropy in nats
        (high_entropy).
    mu_grpo_veto_inclusive (`bool`, defaults to `True`): the trigger token itself is vetoed too.

    > hapo
    hapo_token_group_norm (`bool`, defaults to `True`): Token Level Group Average: group mean/std over tokens
        (each completion weighted by its length, population std, ε 1e-6) instead of the incoming advantage.
    hapo_dar (`bool`, defaults to `True`): Differential Advantage Redistribution at ratio 1: low-entropy tokens
        (ĥ ≤ 0) get `A·(1 + β·ĥ)`.
    hapo_adv_beta (`float`, defaults to `1.0`): DAR's β (official `adv_beta`).
    hapo_entropy_pivot (`float`, defaults to `0.8`): quantile of the batch's log-entropies that splits low from
        high entropy (official `entropy_pivot`).
    hapo_fallback_threshold (`float`, defaults to `5.0`): a group with some |TLGA advantage| ≥ this falls back
        to the incoming advantage (official code's smoothing rule).

    > lopti
    lopti_alpha (`float`, defaults to `0.3`): Advantage Reweighting α; token weight `α·π_old(y_t) + 1 − α`
        (official `reweight_k = α`, `reweight_tau = 1 − α`; 0 = GRPO).

    > gtpo_conflict
    gtpo_conflict_weight (`float`, defaults to `2.0`): weight of the conflict tokens (shared prefix/suffix) of
        positive completions (official W_RAW); those of negative completions get 0.
    gtpo_conflict_entropy_max (`float`, defaults to `0.7`): completions whose mean entropy exceeds it get 0.
    gtpo_conflict_entropy_coef (`float`, defaults to `0.1`): kept completions' advantage becomes `A − c·H̄`.
    gtpo_conflict_normalize (`bool`, defaults to `True`): divide each completion's advantages by its number of
        conflict tokens (at least 1), as the official loss does.

    > d3s_token
    d3s_token_keep_start (`float`, defaults to `0.5`): fraction of real tokens kept (top |A|·H) at step 0 (our
        choice; the paper's value is not public).
    d3s_token_keep_end (`float`, defaults to `1.0`): fraction kept at the last step.
    d3s_token_schedule (`str`, defaults to `"linear"`): keep-ratio schedule `"linear"`, `"cosine"` or
        `"constant"` (= start).
    d3s_token_renormalize (`str`, defaults to `"token"`): `"token"` (global token-mean losses), `"sequence"`
        (sequence-mean losses) or `"none"`: remove dropped tokens from the loss normaliser.

    > temporal_credit
    temporal_credit_magnitude (`float`, defaults to `0.99`): untrained prefix fraction ρ of each completion at
        step 0 (official `initial_schedule_magnitude`).
    temporal_credit_end_fraction (`float`, defaults to `0.8`): fraction of the planned training steps after which
        ρ = 0 (every token trained, = GRPO); official `max_schedule_step` = 0.8·T.
    temporal_credit_schedule (`str`, defaults to `"linear"`): `"linear"`, `"sigmoid"` or `"gamma"` (official
        `schedule_mode`).
    temporal_credit_gamma (`float`, defaults to `2.0`): exponent of the `"gamma"` schedule (official `gamma_ratio`).

    > nat
    nat_scheme (`str`, defaults to `"urs"`): NAT token selection: `"urs"` (each token kept with probability
        `nat_keep_prob`) or `"rpc"` (a random prefix of each completion); kept tokens are weighted by 1/π.
    nat_keep_prob (`float`, defaults to `0.5`): URS inclusion probability q (paper: as few as 50 % of tokens).
    nat_rpc_min_fraction (`float`, defaults to `0.0`): RPC: the kept prefix length is uniform on
        `{max(1, ⌈c·L⌉), …, L}` (our parametrisation; 0 keeps about half the tokens, 1 keeps all).

    > otb
    otb_handle_zero_tail (`bool`, defaults to `False`): verl's `handle_zero_tail`: when one completion of a group is
        strictly the longest, its baseline is 0 beyond the second-longest length (else ≈ its own reward, so ≈ 0
        advantage on that tail).

    > tw_grpo
    tw_grpo_alpha (`float`, defaults to `1.7`): TW-GRPO's largest token weight: weights `1 + (α − 1)·(min-max
        normalised intra-group divergence)` lie in `[1, α]`; 1 gives plain GRPO (official `--alpha 1.70`).

    > blockwise_adv
    blockwise_adv_block_tags (`list[str]`, defaults to `["answer", "confidence"]`): tag names of the text blocks, one
        per reward function in the same order (block `k` ends at `</tag_k>` and gets only `reward_funcs[k]`'s
        advantage; `trl_groupx/token_weights/blocks.py`).
    blockwise_adv_scale_rewards (`bool`, defaults to `True`): divide each block's advantage by its reward's group
        std (+1e-4), as GRPO; `False` keeps `r_k − baseline`.

    > verigate_step (VeriGate's step credit; the PRM is a registered component, not a reward function)
    verigate_step_prm (`str` or `None`, defaults to `None`): registered name of the step PRM (`register_step_prm`;
        built in: `"arithmetic_steps"`, the toy task's first-error steps); required. Called on the completions of
        groups whose rewards are all equal only.
    verigate_step_delimiter (`str`, defaults to `"\\n\\n"`): the text that ends a reasoning step (it belongs to the
        step it ends; a completion without one is one step).

    > rs_grpo
    rs_grpo_block_tags (`list[str]`, defaults to `["evidence", "answer"]`): tag names of the reward scopes, one per
        reward function in the same order (same block rules as `blockwise_adv_block_tags`).
    rs_grpo_scope_average (`bool`, defaults to `True`): rescale the scopes' token advantages so that a global
        token-mean loss equals the official mean of the active scopes' token-mean losses.

    > s_grpo_tspmo
    s_grpo_tspmo_credit (`str`, defaults to `"prefix"`): `"prefix"` (T-SPMO: each token gets the change in mean
        advantage between its prefix-trie node and the node before it; shared-prefix tokens get 0) or `"sequence"`
        (S-GRPO: the sequence advantage on every kept token).
    s_grpo_tspmo_keep_prob (`float`, defaults to `1.0`): probability that a real token enters the loss (S-GRPO's
        stochastic token subset; kept tokens weighted by 1/q as NAT's URS); 1 keeps every token.

    > gcpo_guidance
    gcpo_guidance_top_fraction (`float`, defaults to `0.4`): x of the rank power law `w = p^α`, α = log(1 − y) /
        log(1 − x) − 1 (official x = 40/100).
    gcpo_guidance_top_mass (`float`, defaults to `0.8`): y, the share of the weight the top x of the tokens carry
        (official y = 80/100; with x = 0.4, α ≈ 2.1507).
    gcpo_guidance_ties (`str`, defaults to `"position"`): equal divergences ranked by position (official argsort, so
        identical prompts give a ramp) or `"average"` (mean rank: identical prompts give GRPO's uniform weights).
    gcpo_guidance_negative_template (`str`, defaults to `"{prompt}, but generate the wrong answer"`): the negative
        prompt; `{prompt}` is replaced by the row's prompt text (its last user message when conversational).
        Official default (negative_prompt_type="wrong_answer"); the official runs used a template file ending in
        "Note: Intentionally generate an incorrect answer.".
    gcpo_guidance_negative_prompt_fn (`str` or `None`, defaults to `None`): dotted import path
        `"package.module.function"` of a callable mapping a row's prompt (text or message list) to its negative
        prompt (same form); replaces the template. A path, not a callable, so the config stays serialisable.

    > dcpo
    dcpo_entropy_target (`float`, defaults to `0.5`): H0, the target mean negative log-likelihood per completion
        token (nats; official script `entropy_base` 0.5, the paper's best 0.25).
    dcpo_temperatures (`list[float]`, defaults to `[1.2, 0.8]`): `[T_high, T_low]`: the target distribution's
        temperature while the previous batch's entropy is at or below H0 (raise it) and above H0 (lower it).
    dcpo_entropy_gap_cap (`float`, defaults to `0.1`): cap on `|H0 − H|` in the mixing weight `α = a/(a+1)`,
        `a = min(|H0 − H|, cap) / q` (hard-coded 0.1 in the official code).
    dcpo_success_threshold (`float`, defaults to `0.05`): a completion is successful (`b = 1`, gets the target
        term) when its reward exceeds it (official 0.05).

    > rto
    rto_dpo_model (`str` or `None`, defaults to `None`): model id or local path of the DPO-trained model whose
        implicit reward gives the token rewards (the policy's tokenizer; trained by DPO from the policy's initial
        model, which is the reference of the token rewards). Required by `token_weighting="rto"`.
    rto_dpo_reward_scale (`float`, defaults to `0.05`): β1, the scale of the token rewards
        `β1 (log π_dpo − log π_ref)` (official `--dpo_reward_scale`, 0.05 in the paper's script).
    rto_dpo_reward_clip (`float`, defaults to `0.05`): each scaled token reward is clipped to `±clip`; 0 = no clip
        (official `--dpo_reward_clip`, 0.05 in the paper's script).
    rto_kl_coef (`float`, defaults to `0.01`): coefficient of the reward-side KL penalty `−coef (log π_old −
        log π_ref)` added to each token's reward (official `--init_kl_coef` 0.01); 0 = none.

    > belief_probe
    belief_probe_coef (`float`, defaults to `0.5`): λ of `A_i + λ · Δ̂` (our choice; 0 = GRPO).
    belief_probe_max_segments (`int`, defaults to `8`): K, the most segments per completion (K + 1 probe forwards).
    belief_probe_segmentation (`str`, defaults to `"entropy"`): cut points before the highest-entropy tokens
        (`"entropy"`) or after each `belief_probe_delimiter` (`"delimiter"`).
    belief_probe_entropy_top_fraction (`float`, defaults to `0.2`): q; at most `⌊q · n⌋` of a completion's `n` tokens
        open a segment (entropy cuts).
    belief_probe_delimiter (`str`, defaults to `"\\n\\n"`): text after which a segment ends (delimiter cuts).
    belief_probe_answer_column (`str`, defaults to `"solution"`): dataset column of each prompt's reference answer.
    belief_probe_answer_template (`str`, defaults to `"\\nThe answer is {answer}"`): text appended to the prefix at
        each boundary; the log-probability of the `{answer}` tokens is the belief.
    belief_probe_belief (`str`, defaults to `"prob"`): progress as ΔP(answer) (`"prob"`) or Δ log P (`"logprob"`).
    belief_probe_normalization (`str`, defaults to `"group_rms"`): `"group_rms"`, `"group_zscore"` or `"none"`.
    belief_probe_sign (`str`, defaults to `"free"`): `"outcome"` clips each token's advantage at 0 so that it never
        opposes its rollout's outcome sign.

    > spo_segment
    spo_segment_num_rollouts (`int`, defaults to `9`): K, Monte-Carlo continuations per cut point (official 9; each
        cut costs K extra generations of up to `max_completion_length − j` tokens).
    spo_segment_prob_threshold (`float`, defaults to `0.9`): τ; tokens sampled with probability below it are the cut
        candidates, and the only tokens that get an advantage (official 0.9).
    spo_segment_cut_interval (`int`, defaults to `5`): every interval-th low-probability token is a cut point
        (official SPO-chain int5).
    spo_segment_max_cut_points (`int` or `None`, defaults to `None`): at most this many cut points per completion, the
        first ones (None: all, as the official code); caps the cost.
    spo_segment_mode (`str`, defaults to `"chain"`): `"chain"` (SPO-chain: Monte-Carlo values at low-probability cut
        points) or `"tree"` (SPO-tree: each group is the leaf slots of a tree of fixed-length segments, whose node
        values are the mean rewards of their subtrees; no extra Monte-Carlo rollouts).
    spo_segment_tree_branching (`list[int]` or `None`, defaults to `None`): SPO-tree: children per node at each depth,
        product `num_generations` (official 6-6-6 for groups of 216); None = the group split as evenly as it can be
        over three depths (8 → 2-2-2).
    spo_segment_tree_segment_length (`int` or `None`, defaults to `None`): SPO-tree: M, tokens per segment above the
        last depth (official 30 on GSM8K, 600 on MATH); None = `max_completion_length // depth`.
    """

    token_weighting: str | None = field(
        default=None, metadata={"help": "Token-weight-stage variant id, or None for sequence-level advantages."}
    )
    # gtpo_entropy
    gtpo_level: str = field(default="token", metadata={"help": "GTPO: 'token' (GTPO) or 'sequence' (GRPO-S)."})
    gtpo_alpha1: float = field(default=1.0, metadata={"help": "GTPO: outcome weight α1 (GRPO-S β1)."})
    gtpo_alpha2: float = field(default=0.1, metadata={"help": "GTPO: entropy weight α2 (GRPO-S β2)."})
    gtpo_normalization: str = field(
        default="separate", metadata={"help": "GTPO Eq. 6: 'separate' (success/failure apart) or 'joint'."}
    )
    gtpo_success_threshold: float = field(
        default=0.0, metadata={"help": "GTPO: a completion is successful when its reward exceeds this."}
    )
    # frpo
    frpo_beta: float = field(default=0.01, metadata={"help": "FRPO: coefficient β of the future-KL correction."})
    # wapo
    wapo_positive_group_scale: bool = field(
        default=True, metadata={"help": "WAPO: rescale by #groups / #groups with a positive (official normaliser)."}
    )
    # stapo
    stapo_prob_threshold: float = field(default=0.002, metadata={"help": "STAPO: probability threshold τ_p."})
    stapo_entropy_quantile: float = field(
        default=0.75, metadata={"help": "STAPO: entropy quantile q among low-probability positive tokens."}
    )
    stapo_renormalize: str = field(
        default="token", metadata={"help": "STAPO: renormalise over valid tokens: 'token', 'sequence' or 'none'."}
    )
    # edge_grpo
    edge_grpo_eps: float = field(default=1e-6, metadata={"help": "EDGE-GRPO EDA: floor on the mean entropy divisor."})
    # mu_grpo
    mu_grpo_veto_trigger: str = field(
        default="low_prob", metadata={"help": "Mu-GRPO veto trigger (our choice): 'low_prob' or 'high_entropy'."}
    )
    mu_grpo_veto_threshold: float = field(
        default=0.01, metadata={"help": "Mu-GRPO: trigger probability (low_prob) or entropy (high_entropy)."}
    )
    mu_grpo_veto_inclusive: bool = field(default=True, metadata={"help": "Mu-GRPO: veto the trigger token too."})
    # hapo
    hapo_token_group_norm: bool = field(default=True, metadata={"help": "HAPO: Token Level Group Average norm."})
    hapo_dar: bool = field(default=True, metadata={"help": "HAPO: Differential Advantage Redistribution."})
    hapo_adv_beta: float = field(default=1.0, metadata={"help": "HAPO DAR: β on the entropy term."})
    hapo_entropy_pivot: float = field(default=0.8, metadata={"help": "HAPO: entropy pivot quantile."})
    hapo_fallback_threshold: float = field(
        default=5.0, metadata={"help": "HAPO TLGA: fall back to the incoming advantage when |A| >= this."}
    )
    # lopti
    lopti_alpha: float = field(default=0.3, metadata={"help": "AR (Lopti paper): weight α·p + 1 − α on A."})
    # gtpo_conflict
    gtpo_conflict_weight: float = field(default=2.0, metadata={"help": "GTPO: weight of positive conflict tokens."})
    gtpo_conflict_entropy_max: float = field(
        default=0.7, metadata={"help": "GTPO: drop completions with mean entropy above this."}
    )
    gtpo_conflict_entropy_coef: float = field(default=0.1, metadata={"help": "GTPO: A − coef·mean entropy."})
    gtpo_conflict_normalize: bool = field(
        default=True, metadata={"help": "GTPO: divide a completion's advantages by its conflict-token count."}
    )
    # d3s_token
    d3s_token_keep_start: float = field(default=0.5, metadata={"help": "D3S: token keep ratio at step 0."})
    d3s_token_keep_end: float = field(default=1.0, metadata={"help": "D3S: token keep ratio at the last step."})
    d3s_token_schedule: str = field(default="linear", metadata={"help": "D3S: 'linear', 'cosine' or 'constant'."})
    d3s_token_renormalize: str = field(
        default="token", metadata={"help": "D3S: renormalise over kept tokens: 'token', 'sequence' or 'none'."}
    )
    # temporal_credit
    temporal_credit_magnitude: float = field(
        default=0.99, metadata={"help": "Temporal credit: untrained prefix fraction at step 0."}
    )
    temporal_credit_end_fraction: float = field(
        default=0.8, metadata={"help": "Temporal credit: training fraction after which all tokens are trained."}
    )
    temporal_credit_schedule: str = field(
        default="linear", metadata={"help": "Temporal credit: 'linear', 'sigmoid' or 'gamma'."}
    )
    temporal_credit_gamma: float = field(default=2.0, metadata={"help": "Temporal credit: 'gamma' exponent."})
    # nat
    nat_scheme: str = field(default="urs", metadata={"help": "NAT: token selection 'urs' or 'rpc'."})
    nat_keep_prob: float = field(default=0.5, metadata={"help": "NAT URS: inclusion probability q."})
    nat_rpc_min_fraction: float = field(
        default=0.0, metadata={"help": "NAT RPC: smallest kept prefix fraction c (prefix length uniform on [cL, L])."}
    )
    # otb
    otb_handle_zero_tail: bool = field(
        default=False, metadata={"help": "OTB: zero the baseline on the unique longest completion's lone tail."}
    )
    # tw_grpo
    tw_grpo_alpha: float = field(
        default=1.7, metadata={"help": "TW-GRPO: largest token weight alpha (weights in [1, alpha])."}
    )
    # blockwise_adv
    blockwise_adv_block_tags: list[str] = field(
        default_factory=lambda: ["answer", "confidence"],
        metadata={"help": "Blockwise: tag name of each block, aligned with reward_funcs."},
    )
    blockwise_adv_scale_rewards: bool = field(
        default=True, metadata={"help": "Blockwise: divide each block's advantage by its reward's group std."}
    )
    # verigate_step
    verigate_step_prm: str | None = field(
        default=None, metadata={"help": "VeriGate step credit: registered name of the step PRM (required)."}
    )
    verigate_step_delimiter: str = field(
        default="\n\n", metadata={"help": "VeriGate step credit: the text that ends a reasoning step ('\\n\\n')."}
    )
    # rs_grpo
    rs_grpo_block_tags: list[str] = field(
        default_factory=lambda: ["evidence", "answer"],
        metadata={"help": "RS-GRPO: tag name of each reward scope, aligned with reward_funcs."},
    )
    rs_grpo_scope_average: bool = field(
        default=True, metadata={"help": "RS-GRPO: weight scopes so the token-mean loss averages per-scope losses."}
    )
    # s_grpo_tspmo
    s_grpo_tspmo_credit: str = field(
        default="prefix", metadata={"help": "S-GRPO/T-SPMO: 'prefix' (T-SPMO trie credit) or 'sequence' (S-GRPO)."}
    )
    s_grpo_tspmo_keep_prob: float = field(
        default=1.0, metadata={"help": "S-GRPO/T-SPMO: probability a token enters the loss (weighted by 1/q)."}
    )
    # gcpo_guidance
    gcpo_guidance_top_fraction: float = field(
        default=0.4, metadata={"help": "GCPO: top token fraction x of the rank power law (alpha from x, y)."}
    )
    gcpo_guidance_top_mass: float = field(
        default=0.8, metadata={"help": "GCPO: weight share y carried by the top x tokens."}
    )
    gcpo_guidance_ties: str = field(
        default="position", metadata={"help": "GCPO: tied divergences ranked by 'position' (official) or 'average'."}
    )
    gcpo_guidance_negative_template: str = field(
        default="{prompt}, but generate the wrong answer",
        metadata={"help": "GCPO: negative prompt; '{prompt}' is replaced by the row's prompt text."},
    )
    gcpo_guidance_negative_prompt_fn: str | None = field(
        default=None,
        metadata={"help": "GCPO: dotted path of a callable prompt -> negative prompt (replaces the template)."},
    )
    # dcpo
    dcpo_entropy_target: float = field(default=0.5, metadata={"help": "DCPO: target entropy H0 (nats per token)."})
    dcpo_temperatures: list[float] = field(
        default_factory=lambda: [1.2, 0.8],
        metadata={"help": "DCPO: target temperatures [T_high (entropy <= H0), T_low (entropy > H0)]."},
    )
    dcpo_entropy_gap_cap: float = field(default=0.1, metadata={"help": "DCPO: cap on |H0 - H| in alpha."})
    dcpo_success_threshold: float = field(
        default=0.05, metadata={"help": "DCPO: reward above which a completion gets the target term."}
    )
    # rto
    rto_dpo_model: str | None = field(
        default=None, metadata={"help": "RTO: DPO-trained model id or path (the policy's tokenizer)."}
    )
    rto_dpo_reward_scale: float = field(default=0.05, metadata={"help": "RTO: β1, scale of the DPO token rewards."})
    rto_dpo_reward_clip: float = field(
        default=0.05, metadata={"help": "RTO: clip of each scaled DPO token reward to ±clip; 0 = no clip."}
    )
    rto_kl_coef: float = field(default=0.01, metadata={"help": "RTO: reward-side KL coefficient per token; 0 = none."})
    # belief_probe
    belief_probe_coef: float = field(default=0.5, metadata={"help": "GRPO-VPS: λ of A + λ·progress (0 = GRPO)."})
    belief_probe_max_segments: int = field(default=8, metadata={"help": "GRPO-VPS: most segments per completion."})
    belief_probe_segmentation: str = field(
        default="entropy", metadata={"help": "GRPO-VPS: cut points 'entropy' (top-entropy tokens) or 'delimiter'."}
    )
    belief_probe_entropy_top_fraction: float = field(
        default=0.2, metadata={"help": "GRPO-VPS: at most this share of a completion's tokens open a segment."}
    )
    belief_probe_delimiter: str = field(default="\n\n", metadata={"help": "GRPO-VPS: delimiter of 'delimiter' cuts."})
    belief_probe_answer_column: str = field(
        default="solution", metadata={"help": "GRPO-VPS: dataset column of the reference answers."}
    )
    belief_probe_answer_template: str = field(
        default="\nThe answer is {answer}", metadata={"help": "GRPO-VPS: text appended at each boundary."}
    )
    belief_probe_belief: str = field(default="prob", metadata={"help": "GRPO-VPS: 'prob' (ΔP) or 'logprob'."})
    belief_probe_normalization: str = field(
        default="group_rms", metadata={"help": "GRPO-VPS: 'group_rms', 'group_zscore' or 'none'."}
    )
    belief_probe_sign: str = field(default="free", metadata={"help": "GRPO-VPS: 'free' or 'outcome' (sign-clipped)."})
    # spo_segment
    spo_segment_num_rollouts: int = field(default=9, metadata={"help": "SPO-chain: K continuations per cut point."})
    spo_segment_prob_threshold: float = field(
        default=0.9, metadata={"help": "SPO-chain: τ; tokens with probability below it are cut candidates."}
    )
    spo_segment_cut_interval: int = field(
        default=5, metadata={"help": "SPO-chain: every interval-th low-probability token is a cut point."}
    )
    spo_segment_max_cut_points: int | None = field(
        default=None, metadata={"help": "SPO-chain: most cut points per completion (None: all)."}
    )
    spo_segment_mode: str = field(default="chain", metadata={"help": "SPO: 'chain' (MC cut points) or 'tree'."})
    spo_segment_tree_branching: list[int] | None = field(
        default=None, metadata={"help": "SPO-tree: children per node at each depth, product num_generations."}
    )
    spo_segment_tree_segment_length: int | None = field(
        default=None, metadata={"help": "SPO-tree: tokens per segment above the last depth (None: even split)."}
    )
