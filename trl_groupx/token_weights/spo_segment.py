"""SPO (Segment Policy Optimization): segment advantages from Monte-Carlo values at low-probability cut points
(SPO-chain, `token_weighting="spo_segment"`) or from the node values of a tree grown from each group (SPO-tree,
`spo_segment_mode="tree"`, pure parts in `spo_tree.py`, glue in `spo_tree_rollouts.py`).

Pure parts live here: the cut points of one completion (`cut_points`), the per-token segment advantages
(`segment_advantages`), the probability mask and `masked_whiten`, and the registered variant. The trainer glue that
generates and scores the Monte-Carlo continuations is `spo_segment_rollouts.py` (requirement `segment_mc_values`).
"""

from __future__ import annotations

import math

import torch

from ..contracts import TokenContext, nan_group_mean
from ..registry import register
from ._checks import check_groups, check_rewards

VARIANT_ID = "spo_segment"
OFFICIAL_CODE = ("AIFrameResearch/SPO@b9fc6a263dec54e28137fd488a9b9c0e0d026025:"
                 "src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py")
WHITEN_EPS = 1e-8  # official masked_whiten: (x - mean) * rsqrt(var + 1e-8)


def _validate(config) -> None:
    k = config.spo_segment_num_rollouts
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"spo_segment_num_rollouts must be an integer >= 1 (K Monte-Carlo continuations per cut "
                         f"point; official 9), got {k!r}.")
    p = config.spo_segment_prob_threshold
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"spo_segment_prob_threshold must lie in (0, 1] (tokens sampled with a probability below it "
                         f"are cut points and get the advantage; official 0.9), got {p!r}.")
    interval = config.spo_segment_cut_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"spo_segment_cut_interval must be an integer >= 1 (every interval-th low-probability token "
                         f"is a cut point; official 5), got {interval!r}.")
    cap = config.spo_segment_max_cut_points
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"spo_segment_max_cut_points must be None (no cap, official) or an integer >= 1 (the first "
                         f"M cut points of each completion are valued), got {cap!r}.")
    _validate_tree(config)
    if getattr(config, "use_vllm", False):
        raise ValueError(f"token_weighting={VARIANT_ID!r} generates its Monte-Carlo continuations with transformers "
                         "`generate` from prompt + prefix token ids; it is not tested with use_vllm=True. Set "
                         "use_vllm=False, or use another token_weighting.")


MODES = ("chain", "tree")


def _validate_tree(config) -> None:
    mode = config.spo_segment_mode
    if mode not in MODES:
        raise ValueError(f"spo_segment_mode={mode!r}: use 'chain' (SPO-chain, Monte-Carlo cut points) or 'tree' "
                         "(SPO-tree, groups grown as trees of fixed-length segments).")
    if mode != "tree":
        return
    from .spo_tree import default_branching

    group = config.num_generations
    branching = config.spo_segment_tree_branching
    if branching is not None:
        if (not isinstance(branching, (list, tuple)) or not branching
                or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in branching)):
            raise ValueError(f"spo_segment_tree_branching={branching!r}: use a list of integers >= 1, the children "
                             "per node at each depth (official [6, 6, 6]), or None for an even split of "
                             "num_generations.")
        if math.prod(branching) != group:
            raise ValueError(f"spo_segment_tree_branching={list(branching)} has product {math.prod(branching)}, but "
                             f"the tree's leaves are the group: make the product num_generations={group} (e.g. "
                             f"{default_branching(group)}), or set it to None.")
    depth = len(branching) if branching else 3
    segment = config.spo_segment_tree_segment_length
    if segment is not None and (isinstance(segment, bool) or not isinstance(segment, int) or segment < 1):
        raise ValueError(f"spo_segment_tree_segment_length={segment!r}: use an integer >= 1 (tokens per segment; "
                         "official 30 on GSM8K, 600 on MATH) or None (max_completion_length // depth).")
    if segment is not None and (depth - 1) * segment >= config.max_completion_length:
        raise ValueError(f"spo_segment_tree_segment_length={segment} × {depth - 1} branching depths ≥ "
                         f"max_completion_length={config.max_completion_length}: the last depth would have no "
                         "tokens; shorten the segments or raise max_completion_length.")
    if getattr(config, "rollout_filter", None) is not None:
        raise ValueError(f"spo_segment_mode='tree' grows each group into a tree from TRL's rollouts; "
                         f"rollout_filter={config.rollout_filter!r} also rewrites or drops rollouts, which would "
                         "break the tree's slots. Unset rollout_filter, or use spo_segment_mode='chain'.")
    if getattr(config, "edge_grpo_gec", False):
        raise ValueError("spo_segment_mode='tree' and edge_grpo_gec=True both rewrite the rollouts of a group; "
                         "use one of them.")


# --- cut points ---------------------------------------------------------------------------------------------------


def cut_points(token_logps: torch.Tensor, length: int, prob_threshold: float = 0.9, interval: int = 5,
               max_cut_points: int | None = None) -> list[int]:
    """Sorted cut points of one completion from the rollout log-probs of its first `length` tokens.

    The low-probability tokens `L = [j : p_j < threshold]` (ascending), every `interval`-th of them from the first,
    `L[::interval]`; a cut `j` opens a segment at token `j` and is valued at the prefix `y[:j]` (official cutpoint
    `c = j − 1`, query `decode(y[:c + 1])`). `j = 0` (the prompt itself, valued by the group: see the variant) is
    left out; then at most `max_cut_points`, the first ones (None: all, as the official code)."""
    if length <= 0:
        return []
    probs = token_logps[:length].detach().double().exp().cpu()
    low = torch.nonzero(probs < prob_threshold).flatten().tolist()
    cuts = [j for j in low[::interval] if j > 0]
    return cuts if max_cut_points is None else cuts[:max_cut_points]


# --- advantages -----------------------------------------------------------------------------------------------------


def segment_advantages(values: torch.Tensor, mask: torch.Tensor, root_values: torch.Tensor,
                       rewards: torch.Tensor) -> torch.Tensor:
    """`(N, T)` float64 chain advantages before the probability mask: token `t` of row `i` lies in the segment
    `[j_k, j_{k+1})` between two consecutive cuts and gets `V(after) − V(before)`, with `V(before) = V(y[:j_k])`
    (`root_values[i]` before the first cut) and `V(after) = V(y[:j_{k+1}])` (`rewards[i]` after the last cut).

    `values` `(N, T)`: the Monte-Carlo value at each cut token, NaN elsewhere; a cut is a real token (`mask`) at
    position ≥ 1 with a finite value, nothing else of `values` is read. Per row the segment advantages telescope to
    `R − V(root)`. Padding gets 0."""
    n, t = values.shape
    real = mask.bool()
    positions = torch.arange(t, device=values.device).expand(n, t)
    is_cut = real & ~torch.isnan(values) & (positions >= 1)
    clean = torch.where(is_cut, values.double(), torch.zeros((), dtype=torch.float64, device=values.device))
    # last cut at or before t (0 = none: position 0 is never a cut)
    last = torch.where(is_cut, positions, torch.zeros_like(positions)).cummax(dim=1).values
    before = torch.where(last > 0, clean.gather(1, last), root_values.double()[:, None].expand(n, t))
    # first cut strictly after t (t = none)
    first_at_or_after = torch.where(is_cut, positions, torch.full_like(positions, t)).flip(1).cummin(dim=1).values
    first_at_or_after = first_at_or_after.flip(1)
    after_index = torch.cat([first_at_or_after[:, 1:], torch.full_like(first_at_or_after[:, :1], t)], dim=1)
    after = torch.where(after_index < t, clean.gather(1, after_index.clamp(max=t - 1)),
                        rewards.double()[:, None].expand(n, t))
    return torch.where(real, after - before, torch.zeros_like(before))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, fallback_mask: torch.Tensor,
                  weights: torch.Tensor | None = None) -> torch.Tensor:
    """`(values − mean) · rsqrt(var + 1e-8)` with the mean and the unbiased variance over the entries of `mask`, or
    of `fallback_mask` when `mask` is empty (official `masked_whiten`). Choice: fewer than two entries give variance
    0 (the official Bessel factor divides by 0); no entry at all gives zeros. `weights` (SPO-tree: `1/m` on a token
    that `m` rows share) make each entry count `w` times: the statistics of the distinct tokens."""
    used = mask if mask.any() else fallback_mask
    w = used.to(values.dtype) if weights is None else used.to(values.dtype) * weights.to(values.dtype)
    count = float(w.sum())
    if count == 0:
        return torch.zeros_like(values)
    mean = (w * values).sum() / count
    var = (w * (values - mean) ** 2).sum() / (count - 1) if count > 1 else values.new_zeros(())
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS)


@register(
    VARIANT_ID,
    name="SPO (Segment Policy Optimization): SPO-chain (Monte-Carlo values at low-probability cut points) and SPO-tree "
         "(groups grown as trees of fixed-length segments)",
    paper="Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL for Large Language Models, "
          "arXiv:2505.23564",
    official_code=OFFICIAL_CODE,
    stage="token_weights",
    flags={"token_weighting": VARIANT_ID, "spo_segment_num_rollouts": 9, "spo_segment_prob_threshold": 0.9,
           "spo_segment_cut_interval": 5, "spo_segment_mode": "chain"},
    needs=("K extra sampled continuations per cut point from prompt + completion prefix (K=9: with a share f of "
           "low-probability tokens, ~f·n/interval·K continuations per n-token completion, tens of times GRPO's "
           "generation), scored by the run's reward functions",),
    requires=("old_logps", "segment_mc_values"),
    params=("spo_segment_num_rollouts", "spo_segment_prob_threshold", "spo_segment_cut_interval",
            "spo_segment_max_cut_points", "spo_segment_mode", "spo_segment_tree_branching",
            "spo_segment_tree_segment_length"),
    replaces=("advantages",),
    validate=_validate,
)
def spo_segment_token_advantages(advantages: torch.Tensor, ctx: TokenContext, *,
                                 spo_segment_prob_threshold: float) -> torch.Tensor:
    r"""SPO-chain: each segment of a completion, cut before its low-probability tokens, is credited with the change of
    the Monte-Carlo value over it; only low-probability tokens train; the result is whitened over the batch.

        L_i   = [j : p_{i,j} < τ],  cuts J_i = L_i[::interval] \ {0}            p = rollout-policy token probability
        V_i(j) = mean_k R(x, y_i[:j] + ỹ_k),  ỹ_1 … ỹ_K ~ π(· | x, y_i[:j])       (K continuations per cut)
        V_i(root) = mean of the group's rewards,   V_i(end) = R_i
        Â_{i,t} = V_i(j_{k+1}) − V_i(j_k)        for j_k ≤ t < j_{k+1}  (j_0 = root, j_{S+1} = end)
        M_{i,t} = [p_{i,t} < τ]
        A_{i,t} = M_{i,t} · (Â_{i,t} − μ) / sqrt(σ² + 1e-8),   μ, σ² (unbiased) over the batch's tokens with M = 1

    Σ over a row's segments telescopes to `R_i − V_i(root)`. Shapes: `advantages (N,)` (ignored: the variant replaces
    the advantage stage), `ctx.logps (N, T)` rollout log-probs, `ctx.segment_mc_values (N, T)` the value `V_i(j)` at
    each cut token `j` (NaN elsewhere), output `(N, T)`, 0 on padding.

    Official code: `AIFrameResearch/SPO@b9fc6a263dec54e28137fd488a9b9c0e0d026025`,
    `src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py`:
    `_create_value_estimation_requests` l.919-934 (probabilities `exp` of the training actor's log-probs,
    `cutpoints = where(p < 0.9) − 1`, then `[::cutpoint_interval]`; query = prompt + `decode(y[:c + 1])`, l.803-811;
    identical queries deduplicated, l.1005-1016), `_compute_mc_value` l.505-536 (value = mean reward of the
    rollouts), `_compute_token_advantages` l.347-477 (value at each cutpoint, `score` at the last token, advantage at a
    cutpoint = its value minus the previous one, filled backwards over the segment, l.420-435; tokens with
    `p > 0.9` set to 0, l.437-439); `src/treetune/trainers/utils.py:masked_whiten` l.266-291 (mean and variance over
    response tokens with `p < 0.9`, all response tokens when none; `(x − mean)·rsqrt(var + 1e-8)`) called from
    `src/treetune/trainers/ppo_trainer.py:_training_step` l.820-827 (`distributed=True, unbiased_variance=True`),
    and the loss's action mask `exp(old_logprobs) < 0.9` (`_compute_actor_loss` l.1057-1059). Config
    `configs/polIter_rho1bSft2_spo_chain_MATH.jsonnet` (samples 9, use_prob_mask true) with
    `configs/episode_generators/interval5.jsonnet` (SPO-chain int5 on GSM8K).

    SPO-tree (`spo_segment_mode="tree"`, official `configs/polIter_qwen1b_spo_tree_MATH.jsonnet`:
    `hybrid_episode_generator`, `M` 600, depth 3, branching 6-6-6; `polIter_rho1bSft2_spo_tree_GSM8K.jsonnet`: `M` 30):
    each group is the `G = Π b_d` leaf slots of one tree (`spo_tree.py`, grown by `spo_tree_rollouts.py`), so the
    cuts are the segment boundaries `j = M, 2M, …` a response reaches and `V(j)` is the mean reward of the slots under
    that node (official `HybridInferenceStrategy._construct_tree`, `src/treetune/inference_strategies/
    hybrid_inference_strategy.py` l.333-411: `node["reward"] = mean(child rewards)`); `V(root)` is again the group's
    mean. The edge advantage `V(child) − V(parent)` is the official `adv_method="rloo"` (`tree_episode_generator.py:
    extract_edges_from_tree` l.112-176), spread over the segment's tokens (`hybrid_episode_generator.py:
    _compute_token_advantages` l.610-672); the official tree config keeps the chain trainer's probability mask and
    whitening (`use_prob_mask: true`, `whiten_advantages: true`), applied here as above. Then

        A_{i,t} ← A_{i,t} / m_{d(t)},   m_d = b_{d+1} ⋯ b_{D−1}     (`ctx.segment_multiplicity`, training batches)

    Tree choices: the official trains each edge once, as its own (prefix → segment) sample; here every slot is a
    row holding its root-to-leaf path, so a depth-`d` segment appears in `m_d` rows. Its tokens enter the whitening
    statistics with weight `1/m_d` (the statistics of the distinct edge tokens, the official's) and its advantage is
    divided by `m_d` (the gradient summed over those rows is one edge's; the loss normaliser still counts every
    row's tokens). Edges with `V(child) = V(parent)` are dropped before the whitening (official
    `only_adv_greater_than_zero=True`, which keeps `advantage + prover_advantage ≠ 0`, i.e. `V(child) ≠ V(parent)`):
    their tokens get 0 and stay out of the statistics. No edge replay buffer is kept (the official reuses unseen
    edges for up to 8 iterations, at most 32 per question). Chain-only flags (`spo_segment_num_rollouts`, `…_cut_interval`, `…_max_cut_points`) are unused.

    Choices:
      * V(root): the mean reward of the completion's group over its scored rollouts (G samples from the prompt,
        GRPO's baseline) instead of K extra continuations of the bare prompt (the official code generates them only
        when token 0 itself is a cut, `cutpoints[0] == -1`; otherwise it gives the first segment 0). Either way the
        first segment's tokens before the first low-probability token are masked.
      * The probability mask is applied as the official code does three times, once: only tokens with `p < τ`
        get an advantage and enter the whitening statistics (the official `p > 0.9 → 0`, `p < 0.9` statistics and
        `p < 0.9` loss mask agree except at `p = 0.9` exactly, which trains nowhere). The loss normaliser is the run's
        `loss_type` over all completion tokens (the official loss averages over the low-probability tokens only):
        a constant-per-batch scale, not a direction change.
      * Whitening over the whole generation batch on every process (the official over each PPO mini-batch); with
        fewer than two tokens the variance is 0.
      * A continuation is scored by the run's reward functions as the response `y[:j] + continuation`, also when it
        ran out of tokens (the official code gives a rollout that stopped at its length limit the task's
        unfinished-response penalty instead); its budget is `max_completion_length − j` (see
        `spo_segment_rollouts`).
      * A cut whose K continuations are all unscored (NaN) is dropped: its segment merges with the previous one.
        Unscored rollouts (NaN reward) and rollouts the sampling stage dropped get 0 and stay out of the statistics;
        ±inf rewards raise.
      * Evaluation batches are not rolled out: each completion is one segment, `R − V(root)`, masked and whitened.
      * Probabilities are the rollout policy's at the sampling temperature (TRL's log-probs, logits / T; the official
        trainer also divides by its sampling temperature) from one no-grad forward of the training model, as the
        official `get_episodes_w_actor_logps` (not the generator's).
    """
    check_groups(ctx.completion_mask.shape[0], ctx.group_size)
    if ctx.rewards is None or ctx.logps is None:
        raise ValueError(f"token_weighting={VARIANT_ID!r} needs the rewards and the rollout log-probs.")
    check_rewards(VARIANT_ID, ctx.rewards)
    device = ctx.completion_mask.device
    mask = ctx.completion_mask.to(device).bool()
    rewards = ctx.rewards.to(device).double()
    scored = ~torch.isnan(rewards)
    values = ctx.segment_mc_values
    if values is None:
        values = torch.full(mask.shape, math.nan, dtype=torch.float64, device=device)
    root = nan_group_mean(rewards, ctx.group_size)
    safe_rewards = torch.where(scored, rewards, torch.zeros_like(rewards))
    safe_root = torch.where(torch.isnan(root), torch.zeros_like(root), root)
    raw = segment_advantages(values.to(device), mask, safe_root, safe_rewards)
    rows = mask & scored[:, None]
    low = rows & (ctx.logps.to(device).double().exp() < spo_segment_prob_threshold)
    shared = None if ctx.segment_multiplicity is None else ctx.segment_multiplicity.to(raw)  # SPO-tree
    if shared is not None:  # official `only_adv_greater_than_zero`: edges with V(child) = V(parent) are dropped
        low = low & (raw != 0)
        rows = low
    whitened = masked_whiten(raw, low, rows, None if shared is None else 1.0 / shared)
    out = torch.where(low, whitened, torch.zeros_like(whitened))
    if shared is not None:  # each tree edge once: a shared segment is split over its rows
        out = out / shared
    return out.float()
