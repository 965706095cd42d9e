"""GRPO-VPS belief probing: segment-wise progress of the policy's belief in the reference answer refines the GRPO
advantage per segment (`token_weighting="belief_probe"`).

Pure parts live here: the cut points (`entropy_cut_points`, `delimiter_cut_points`), the boundaries of one completion
(`completion_boundaries`), the per-token segment ids, the segment progress and its normalisation, and the registered
variant. The trainer glue that runs the teacher-forced probes is `belief_probe_forward.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..contracts import TokenContext, grouped
from ..registry import register
from ._checks import check_groups, clean_advantages

VARIANT_ID = "belief_probe"
SEGMENTATIONS = ("entropy", "delimiter")
BELIEF_SCALES = ("prob", "logprob")
NORMALIZATIONS = ("group_rms", "group_zscore", "none")
SIGN_MODES = ("free", "outcome")
ANSWER_PLACEHOLDER = "{answer}"
DEFAULT_ANSWER_TEMPLATE = "\nThe answer is {answer}"
NO_SEGMENT = -1  # segment id of padding


def _validate(config) -> None:
    coef = config.belief_probe_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        raise ValueError(f"belief_probe_coef must be a finite number >= 0 (λ of A + λ·progress; 0 = GRPO), got "
                         f"{coef!r}.")
    k = config.belief_probe_max_segments
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"belief_probe_max_segments must be an integer >= 1 (K segments cost K + 1 probe forwards "
                         f"per completion), got {k!r}.")
    q = config.belief_probe_entropy_top_fraction
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q <= 1.0:
        raise ValueError(f"belief_probe_entropy_top_fraction must lie in (0, 1] (share of a completion's tokens that "
                         f"may open a segment), got {q!r}.")
    for name, allowed in (("belief_probe_segmentation", SEGMENTATIONS), ("belief_probe_belief", BELIEF_SCALES),
                          ("belief_probe_normalization", NORMALIZATIONS), ("belief_probe_sign", SIGN_MODES)):
        if getattr(config, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(config, name)!r}.")
    delimiter = config.belief_probe_delimiter
    if config.belief_probe_segmentation == "delimiter" and (not isinstance(delimiter, str) or not delimiter):
        raise ValueError(f"belief_probe_segmentation='delimiter' needs a non-empty belief_probe_delimiter (e.g. "
                         f"'\\n\\n'), got {delimiter!r}.")
    template = config.belief_probe_answer_template
    if not isinstance(template, str) or template.count(ANSWER_PLACEHOLDER) != 1:
        raise ValueError(f"belief_probe_answer_template must contain '{{answer}}' exactly once (where the reference "
                         f"answer goes; default {DEFAULT_ANSWER_TEMPLATE!r}), got {template!r}.")
    column = config.belief_probe_answer_column
    if not isinstance(column, str) or not column:
        raise ValueError(f"belief_probe_answer_column must name the dataset column holding each prompt's reference "
                         f"answer (e.g. 'solution' or 'answer'), got {column!r}.")


# --- cut points ---------------------------------------------------------------------------------------------------


def entropy_cut_points(entropies: torch.Tensor, length: int, max_segments: int, top_fraction: float) -> list[int]:
    """Sorted cut points of one completion's first `length` tokens from their entropies `(≥ length,)`.

    A cut `c` opens a segment at token `c` (the prefix of the probe is tokens `[0, c)`). Candidates are `1 … length−1`
    (no empty segment); the `m = min(K − 1, ⌊q · length⌋, length − 1)` candidates of highest entropy are cut, ties
    to the earlier token. Entropy `H_c` is that of the distribution token `c` was drawn from: a cut sits right before
    a token where the policy hesitated."""
    m = min(max_segments - 1, math.floor(top_fraction * length), length - 1)
    if m <= 0:
        return []
    candidate = entropies[1:length].detach().float().cpu()
    order = torch.sort(-candidate, stable=True).indices[:m]
    return sorted(int(i) + 1 for i in order)


def delimiter_cut_points(token_texts: Sequence[str], length: int, max_segments: int, delimiter: str) -> list[int]:
    """Sorted cut points of one completion's first `length` tokens: right after every token that completes an
    occurrence of `delimiter` in the text `"".join(token_texts[:length])`, the first `K − 1` that fall inside
    (`1 … length−1`)."""
    ends, total = [], 0
    for text in token_texts[:length]:
        total += len(text)
        ends.append(total)
    text = "".join(token_texts[:length])
    cuts: list[int] = []
    start = text.find(delimiter)
    while start >= 0 and len(cuts) < max_segments - 1:
        last_char = start + len(delimiter) - 1
        token = next(j for j, end in enumerate(ends) if end > last_char)
        cut = token + 1
        if 1 <= cut <= length - 1 and (not cuts or cut > cuts[-1]):
            cuts.append(cut)
        start = text.find(delimiter, start + len(delimiter))
    return cuts


def completion_boundaries(n_tokens: int, ends_with_eos: bool, cuts: Sequence[int]) -> list[int]:
    """Prefix lengths probed for one completion: `[0, c_1, …, c_{S−1}, n']`, `n'` = the tokens before a final EOS
    (the answer is appended to the text, not after the end-of-turn token). Empty completion: `[]`."""
    if n_tokens == 0:
        return []
    content = n_tokens - 1 if ends_with_eos else n_tokens
    return [0, *[c for c in cuts if 0 < c < content], content]


def segment_ids_from_boundaries(boundaries: Sequence[int], n_tokens: int, width: int) -> torch.Tensor:
    """`(width,)` long: segment `j` (0-based) for tokens `[b_j, b_{j+1})`, the final EOS (at `b_S`) in the last
    segment, −1 on padding."""
    ids = torch.full((width,), NO_SEGMENT, dtype=torch.long)
    if not boundaries:
        return ids
    for j in range(len(boundaries) - 1):
        ids[boundaries[j] : boundaries[j + 1]] = j
    ids[boundaries[-1] : n_tokens] = len(boundaries) - 2
    return ids


# --- progress and advantages ----------------------------------------------------------------------------------------


def segment_progress(answer_logps: torch.Tensor, belief: str = "prob") -> torch.Tensor:
    """`(N, K)` progress of each segment from the `(N, K + 1)` answer log-probs at the boundaries (NaN where a row has
    no such boundary): `Δ_j = v_{j+1} − v_j` with `v = exp(log p)` (`"prob"`: ΔP(answer)) or `v = log p`
    (`"logprob"`); NaN past a row's last segment."""
    values = answer_logps.double().exp() if belief == "prob" else answer_logps.double()
    return values[:, 1:] - values[:, :-1]


def normalized_progress(progress: torch.Tensor, valid_rows: torch.Tensor, group_size: int,
                        normalization: str = "group_rms") -> torch.Tensor:
    """`(N, K)` progress scaled within each group over the segments of its `valid_rows` (others: 0; NaN entries:
    0). `"group_rms"`: `Δ / sqrt(mean Δ²)`, sign kept (a segment that raises the belief is credited, one that lowers
    it is debited); `"group_zscore"`: `(Δ − mean) / std` (population std); `"none"`: `Δ`. A group whose scale is 0
    (flat belief) gets 0."""
    real = ~torch.isnan(progress) & valid_rows[:, None]
    delta = torch.where(real, progress, torch.zeros_like(progress))
    if normalization == "none":
        return delta
    g_real = grouped(real, group_size).flatten(1).double()
    g_delta = grouped(delta, group_size).flatten(1)
    count = g_real.sum(1, keepdim=True)
    mean = (g_delta * g_real).sum(1, keepdim=True) / count.clamp(min=1)
    if normalization == "group_zscore":
        centred = (g_delta - mean) * g_real
        scale = (centred.pow(2).sum(1, keepdim=True) / count.clamp(min=1)).sqrt()
    else:
        centred = g_delta
        scale = (g_delta.pow(2) * g_real).sum(1, keepdim=True).div(count.clamp(min=1)).sqrt()
    tiny = torch.finfo(torch.float32).tiny
    out = torch.where(scale > tiny, centred / scale.clamp(min=tiny), torch.zeros_like(centred)) * g_real
    return out.view_as(delta)


def combine(advantages: torch.Tensor, bonus: torch.Tensor, coef: float, sign: str = "free") -> torch.Tensor:
    """`A_{i,j} = A_i + λ · bonus_{i,j}`; with `sign="outcome"` clipped at 0 so that no segment of a rewarded
    (`A_i > 0`) rollout is pushed down and no segment of a penalised one (`A_i < 0`) up (`A_i = 0`: unclipped)."""
    out = advantages[:, None] + coef * bonus
    if sign == "outcome":
        a = advantages[:, None].expand_as(out)
        out = torch.where(a > 0, out.clamp(min=0), torch.where(a < 0, out.clamp(max=0), out))
    return out


@register(
    VARIANT_ID,
    name="GRPO-VPS (belief-probing segment progress, model-free verifiable process supervision)",
    paper="GRPO-VPS: Enhancing Group Relative Policy Optimization with Verifiable Process Supervision for Effective "
          "Reasoning, arXiv:2604.20659",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": VARIANT_ID, "belief_probe_coef": 0.5, "belief_probe_max_segments": 8,
           "belief_probe_segmentation": "entropy", "belief_probe_entropy_top_fraction": 0.2},
    needs=("reference answer column (belief_probe_answer_column)",
           "K + 1 extra no-grad teacher-forced forwards per completion (prompt + prefix + answer), chunked",),
    requires=("entropies", "answer_belief"),
    params=("belief_probe_coef", "belief_probe_max_segments", "belief_probe_segmentation",
            "belief_probe_entropy_top_fraction", "belief_probe_delimiter", "belief_probe_answer_column",
            "belief_probe_answer_template", "belief_probe_belief", "belief_probe_normalization", "belief_probe_sign"),
    validate=_validate,
)
def belief_probe_token_advantages(
    advantages: torch.Tensor, ctx: TokenContext, *, belief_probe_coef: float, belief_probe_belief: str,
    belief_probe_normalization: str, belief_probe_sign: str,
) -> torch.Tensor:
    r"""GRPO-VPS: the GRPO advantage of each rollout refined per segment by the progress of the policy's belief in the
    reference answer over that segment.

        b_{i,k} = log π(a | x, y_i[:c_k]) = Σ_m log π(a_m | x, y_i[:c_k], template, a_{<m})   k = 0 … S_i
        Δ_{i,j} = v(b_{i,j+1}) − v(b_{i,j}),   v = exp (ΔP(answer), default) or identity (Δ log P)
        Δ̂_{i,j} = Δ_{i,j} / sqrt(mean_{g} Δ²)          (group RMS over the segments of the group's scored rollouts)
        A_{i,t} = A_i + λ · Δ̂_{i,j(t)}                  (t in segment j; 0 on padding and on unscored rollouts)

    `c_0 = 0 < c_1 < … < c_S = n'` are the cut points of completion `i` (`n'` its tokens before a final EOS, which
    joins the last segment); `a` the row's reference answer, appended through `belief_probe_answer_template` and
    scored by teacher forcing under the rollout policy (no grad; `ctx.answer_belief_logps`, `(N, K + 1)`, NaN past
    `S_i`); `ctx.belief_segment_ids` `(N, T)` the segment `j` of every token (−1 on padding). Shapes: `advantages
    (N,)`, output `(N, T)`. λ = 0 gives GRPO's advantage on every token; a flat belief (all Δ = 0) too, whatever λ.
    Σ_j Δ_{i,j} = v(b_{i,S}) − v(b_{i,0}) telescopes: the progress is a potential-based shaping of the belief.

    Paper: arXiv:2604.20659 (GRPO-VPS). No official code was found; the method section could not be read (only the
    abstract: "segmenting the generation into discrete steps and tracking the conditional probability of the correct
    answer appended at each segment boundary ... segment-wise progress measurements to refine GRPO's
    trajectory-level feedback"), and the notes on the paper say the segments come from entropy-based cut points.
    Every rule below is therefore ours:

    Choices:
      * Cut points (`belief_probe_segmentation`): `"entropy"` (default) cuts right before the completion's
        highest-entropy tokens, the `min(K − 1, ⌊q·n'⌋)` of them (`belief_probe_max_segments` K = 8,
        `belief_probe_entropy_top_fraction` q = 0.2), ties to the earlier token; `"delimiter"` cuts after every
        occurrence of `belief_probe_delimiter` (e.g. `"\n\n"`, the catalog's flag), the first K − 1.
      * The probe: the prompt's tokens as generated, the completion's first `c_k` tokens, then the tokens of the
        template text before `{answer}` (`belief_probe_answer_template`, default `"\nThe answer is {answer}"`) and
        of the answer, each tokenised on its own (so the scored tokens are exactly `tokenize(answer)`); text after
        `{answer}` cannot change the answer's probability and is not sent. Logits divided by the sampling
        temperature (the policy TRL trains). Cost: `S_i + 1 ≤ K + 1` probes per completion, each as long as
        prompt + prefix + answer, run without grad in chunks of `per_device_train_batch_size`.
      * Belief scale (`belief_probe_belief`): `"prob"` (default), `P(a | ·) = exp(b)`, as the paper's "conditional
        probability"; `"logprob"` for long answers whose probability underflows.
      * Normalisation (`belief_probe_normalization`): `"group_rms"` (default) divides by the RMS of the group's
        segment progress, so the bonus is on the scale of the z-scored A while its sign still says whether the
        segment raised the belief (a segment of flat belief gets exactly 0: only the segment that moved the belief
        is credited); `"group_zscore"` also centres (credit relative to the group's average segment); `"none"`.
      * Combination: additive, `A + λ·Δ̂` with λ = `belief_probe_coef` (default 0.5: the process term at half the
        outcome term's scale); λ = 0 is GRPO. `belief_probe_sign="outcome"` clips each token at 0 so that it never
        opposes its rollout's outcome sign; the default `"free"` lets a segment that lowered the belief be
        debited even in a rewarded rollout (process supervision), and gives all-equal groups (A = 0) a process
        signal.
      * Unscored rollouts (NaN reward) and rollouts the sampling stage dropped get 0 and stay out of the group
        statistics; empty completions have no segment; a truncated completion's last boundary is its last token.
        A row whose answer is blank raises (on every process). Evaluation batches are not probed (GRPO's advantage).
      * The rollout entropies are computed whatever the segmentation (one no-grad forward; unused by delimiter
        cuts). Multi-turn completions are probed over all their tokens, tool outputs included. The probe passes
        `position_ids` and `logits_to_keep` to the model (every transformers causal LM takes them); image prompts
        are refused.
    """
    if ctx.belief_segment_ids is None or ctx.answer_belief_logps is None:
        raise ValueError(f"token_weighting={VARIANT_ID!r} needs each token's segment and the answer log-probs at the "
                         "segment boundaries (requirement 'answer_belief').")
    n = ctx.completion_mask.shape[0]
    check_groups(n, ctx.group_size)
    adv = clean_advantages(VARIANT_ID, advantages, ctx.rewards)
    device = ctx.completion_mask.device
    scored = torch.ones(n, dtype=torch.bool, device=device)
    if ctx.rewards is not None:
        scored = ~torch.isnan(ctx.rewards.to(device))
    segments = ctx.belief_segment_ids.to(device).masked_fill(~ctx.completion_mask.bool(), NO_SEGMENT)
    real = segments >= 0
    progress = segment_progress(ctx.answer_belief_logps.to(device), belief_probe_belief)
    # a row's segments are those its tokens name: boundaries past them (NaN by contract) are never read
    n_segments = segments.max(dim=1).values + 1
    named = torch.arange(progress.shape[1], device=device)[None, :] < n_segments[:, None]
    progress = torch.where(named, progress, torch.full_like(progress, math.nan))
    bonus = normalized_progress(progress, scored, ctx.group_size, belief_probe_normalization)
    per_segment = combine(adv.double().to(device), bonus, belief_probe_coef, belief_probe_sign)
    index = segments.clamp(min=0, max=per_segment.shape[1] - 1)
    token_adv = torch.gather(per_segment, 1, index).float()
    # tokens outside every segment (none on real tokens unless the trainer sent none) keep the rollout's advantage
    fallback = adv.to(device)[:, None].expand_as(token_adv)
    token_adv = torch.where(real, token_adv, fallback)
    token_adv = torch.where(scored[:, None], token_adv, torch.zeros_like(token_adv))
    return token_adv * ctx.completion_mask.to(token_adv.dtype)
