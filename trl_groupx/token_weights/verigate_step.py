"""VeriGate's step credit: where the verifier separates a group, its advantages as they are; where it does not (all
rewards equal), a process reward model's per-step scores turned into group-normalised reward-to-go token
advantages (Verifier-Gated Step-Level GRPO, arXiv:2605.30451; no public code).

The token-level counterpart of `advantage_estimator="verigate"` (sequence level, `advantages/verigate.py`), as
`d3s_token` is of `d3s`: its output is one advantage per token, which only the token-weight stage returns, and its
PRM returns one score per step, which TRL's reward functions cannot, so the PRM is a component of its own, registered
by name and called by the trainer on the degenerate groups' completions only:

    from trl_groupx.token_weights.verigate_step import register_step_prm
    register_step_prm("my_prm", my_prm)      # (prompts, completions, steps, **columns) -> one list of scores per row
    GRPOConfig(token_weighting="verigate_step", verigate_step_prm="my_prm", verigate_step_delimiter="\\n\\n")

`"arithmetic_steps"` (built in) is a rule-based toy PRM for the shipped arithmetic task
(`trl_groupx.rewards.arithmetic_step_prm`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..advantages._group_judges import NamedJudges, call_judge_on_rows, local_selected_rows
from ..contracts import TokenContext, grouped
from ..registry import register
from ..rewards.arithmetic_step_prm import arithmetic_step_prm

VARIANT_ID = "verigate_step"
PRM_FLAG = "verigate_step_prm"
_EPS = 1e-4  # TRL's std epsilon, so that both branches have GRPO's scale
NO_STEP = -1

STEP_PRMS = NamedJudges(PRM_FLAG, "trl_groupx.token_weights.verigate_step.register_step_prm")
register_step_prm = STEP_PRMS.register
register_step_prm("arithmetic_steps", arithmetic_step_prm)


def _validate(config) -> None:
    STEP_PRMS.check(config.verigate_step_prm)
    delimiter = config.verigate_step_delimiter
    if not isinstance(delimiter, str) or not delimiter:
        raise ValueError(f"verigate_step_delimiter must be a non-empty string (the text that ends a reasoning step, "
                         f"e.g. '\\n\\n'), got {delimiter!r}.")
    for flag in ("num_generations", "num_generations_eval"):
        g = getattr(config, flag, None)
        if g is not None and g < 2:
            raise ValueError(f"token_weighting='verigate_step' gates on whether the verifier separates a group: "
                             f"{flag}={g} leaves one response per group; use num_generations >= 2.")


# ---- pure parts -----------------------------------------------------------------------------------------------


def degenerate_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(N/G,)` bool: groups whose scored (non-NaN) rewards are all equal, or that have fewer than two scored."""
    r = grouped(rewards, group_size)
    scored = ~torch.isnan(r)
    high = torch.where(scored, r, torch.full_like(r, -math.inf)).amax(dim=1)
    low = torch.where(scored, r, torch.full_like(r, math.inf)).amin(dim=1)
    return ~(high > low)


def step_char_spans(text: str, delimiter: str) -> list[tuple[float, float]]:
    """`[start, end)` character span of each step of `text`: a step ends right after each occurrence of `delimiter`
    (the delimiter belongs to the step it ends); the text after the last one is the last step. The last step's end
    is `inf`, so that trailing tokens without text (EOS) belong to it. No step in an empty text."""
    spans: list[tuple[float, float]] = []
    start = 0
    while (found := text.find(delimiter, start)) >= 0:
        spans.append((start, found + len(delimiter)))
        start = found + len(delimiter)
    if start < len(text):
        spans.append((start, len(text)))
    if spans:
        spans[-1] = (spans[-1][0], math.inf)
    return spans


def token_steps(pieces: Sequence[str], delimiter: str) -> tuple[list[int], list[str]]:
    """The step of each token (a token belongs to the step holding the first character of its text; a token with
    no text, to the step holding its position) and the step texts, for one completion given as its tokens' texts."""
    text = "".join(pieces)
    spans = step_char_spans(text, delimiter)
    steps, offset = [], 0
    for piece in pieces:
        steps.append(next((k for k, (lo, hi) in enumerate(spans) if lo <= offset < hi), NO_STEP))
        offset += len(piece)
    return steps, [text[int(lo):] if hi == math.inf else text[int(lo):int(hi)] for lo, hi in spans]


def reward_to_go(step_scores: torch.Tensor) -> torch.Tensor:
    """`(N, S)` step scores, left-aligned and NaN-padded → `(N, S)` `R_k = Σ_{j≥k} s_j` on the same steps, NaN on
    the padding. A NaN before a score (a gap) is an error: a row is scored on all its steps or not at all."""
    valid = ~torch.isnan(step_scores)
    if (valid[:, 1:] & ~valid[:, :-1]).any():
        raise ValueError("token_weighting='verigate_step': step scores must be left-aligned with NaN padding only "
                         "after a row's last step (a row's PRM scores are all present or the row is unscored).")
    filled = torch.where(valid, step_scores, torch.zeros_like(step_scores))
    to_go = filled.flip(1).cumsum(1).flip(1)
    return torch.where(valid, to_go, torch.full_like(to_go, math.nan))


def group_step_zscores(to_go: torch.Tensor, member: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(N, S)` reward-to-go, `(N,)` bool rows taking part → `(N, S)` `(R − μ_g) / (σ_g + 1e-4)`, `μ_g`, `σ_g` the
    mean and unbiased std over every step of the group's taking-part rows; 0 for other rows, padding, and groups
    with fewer than two such steps."""
    valid = ~torch.isnan(to_go) & member[:, None]
    x = torch.where(valid, to_go, torch.zeros_like(to_go))
    xv, vv = grouped(x, group_size), grouped(valid, group_size)  # (B, G, S)
    count = vv.sum(dim=(1, 2), keepdim=True)
    mean = xv.sum(dim=(1, 2), keepdim=True) / count.clamp(min=1)
    var = torch.where(vv, (xv - mean) ** 2, torch.zeros_like(xv)).sum(dim=(1, 2), keepdim=True) / (count - 1).clamp(
        min=1)
    z = (xv - mean) / (var.sqrt() + _EPS)
    return torch.where(vv & (count >= 2), z, torch.zeros_like(z)).reshape(to_go.shape)


@register(
    VARIANT_ID,
    name="VeriGate (Verifier-Gated Step-Level GRPO), step-level credit",
    paper="VeriGate: Verifier-Gated Step-Level GRPO, arXiv:2605.30451",
    official_code=None,
    stage="token_weights",
    # The toy PRM makes the flags runnable on the shipped arithmetic task; a real run names its own step PRM.
    flags={"token_weighting": VARIANT_ID, PRM_FLAG: "arithmetic_steps", "verigate_step_delimiter": "\n\n"},
    params=(PRM_FLAG, "verigate_step_delimiter"),
    needs=(("a process reward model registered with register_step_prm and named by verigate_step_prm: "
            "(prompts, completions, steps, **columns) -> one list of step scores per completion"),),
    requires=("prm_step_scores",),
    validate=_validate,
)
def verigate_step_token_advantages(advantages: torch.Tensor, ctx: TokenContext) -> torch.Tensor:
    r"""VeriGate step credit: verifier advantages where the verifier separates the group, PRM reward-to-go token
    advantages where it does not.

    With `r_i` the rewards of a group of `G` responses (the run's reward functions: the verifier) and `A_i` the
    incoming advantages (the advantage stage's; GRPO's by default):

    - the group is *degenerate* when its scored rewards are all equal (or fewer than two are scored);
    - mixed group: every real token of response `i` gets `A_i`, exactly the sequence advantage (GRPO's numbers,
      so the loss is GRPO's), and the PRM is never called on it;
    - degenerate group: response `i` is split into steps `k = 1..K_i` at `verigate_step_delimiter`; the PRM scores
      them, `s_{i,k}`; the reward-to-go `R_{i,k} = Σ_{j≥k} s_{i,j}` is normalised over all steps of the group,
      `Â_{i,k} = (R_{i,k} − μ_g) / (σ_g + 1e-4)` with `μ_g`, `σ_g` the mean and unbiased std of
      `{R_{i,k} : i in g, k ≤ K_i}`; every token of step `k` gets `Â_{i,k}`.

    Shapes: `advantages (N,)`, `ctx.rewards (N,)`, `ctx.prm_step_ids (N, T)` long (the step of each token, −1 on
    padding and on rows outside degenerate groups), `ctx.prm_step_scores (N, S)` (left-aligned, NaN-padded, NaN
    rows where the PRM was not called or returned `None`) → `(N, T)`, 0 on padding.

    Citation: arXiv:2605.30451 (abstract; catalog row `verigate`, seed 001_a802f1d2c360f935.txt ¶0 line 5: "only for
    degenerate (all-equal) groups it switches to PRM step scores, converted to future-cumulated (reward-to-go) step
    rewards and then group-normalised into token-level advantages"). No public code.

    Choice: the normalisation set (official-code.md: "unknown") is every step of every scored response of the group,
    pooled, with GRPO's z-score (unbiased std + 1e-4) so that both branches share GRPO's scale; a per-step-index
    normalisation would compare step `k` of responses that split differently. Choice: steps are the text between
    occurrences of `verigate_step_delimiter` (the delimiter ends its step; a completion without one is one step);
    a token belongs to the step holding its first character; tokens without text after the last step (EOS) belong
    to it. Choice: "degenerate" is exact equality of the scored rewards (the abstract's "same verifier reward"), on
    the run's weighted reward sum: the PRM is not a reward function here. Choice: evaluation batches are not
    PRM-scored (their degenerate groups get the incoming advantages, GRPO's 0). NaN: a response whose reward is
    NaN is not sent to the PRM and gets 0; a response the PRM returns `None` for (or `None` in one of its steps) gets
    0 and is left out of the statistics; an empty completion has no step and gets 0; a group with fewer than two
    scored steps gets 0.

    Args:
        advantages (`torch.Tensor`): `(N,)` advantages of the advantage stage.
        ctx (`TokenContext`): with `rewards`, `prm_step_ids`, `prm_step_scores` (requirement `prm_step_scores`).

    Returns:
        `torch.Tensor`: `(N, T)` finite token advantages.
    """
    if ctx.group_size < 2:
        raise ValueError(f"token_weighting='verigate_step' needs groups of at least two responses (group_size="
                         f"{ctx.group_size}); use num_generations >= 2.")
    mask = ctx.completion_mask
    rewards = ctx.rewards if ctx.rewards is not None else torch.zeros(mask.shape[0])
    if torch.isinf(rewards).any():
        raise ValueError("token_weighting='verigate_step' got an infinite reward; rewards must be finite (NaN marks an "
                         "unscored rollout).")
    token_adv = advantages.to(mask.device, torch.float32)[:, None] * mask.float()
    if ctx.prm_step_scores is None or ctx.prm_step_ids is None:  # no degenerate group was PRM-scored
        return token_adv
    scores = ctx.prm_step_scores.to(mask.device, torch.float32)
    if torch.isinf(scores).any():
        raise ValueError(f"{PRM_FLAG}: the PRM returned an infinite step score; return finite scores (None for a "
                         "completion it cannot score).")
    degenerate = degenerate_groups(rewards.to(mask.device), ctx.group_size).repeat_interleave(ctx.group_size)
    scored = degenerate & ~torch.isnan(rewards.to(mask.device)) & ~torch.isnan(scores).all(dim=1)
    step_adv = group_step_zscores(reward_to_go(scores), scored, ctx.group_size)  # (N, S)
    ids = ctx.prm_step_ids.to(mask.device)
    inside = (ids >= 0) & (ids < step_adv.shape[1]) & mask.bool()
    picked = step_adv.gather(1, ids.clamp(min=0, max=max(step_adv.shape[1] - 1, 0)))
    step_tokens = torch.where(inside, picked, torch.zeros_like(picked))
    return torch.where(degenerate[:, None], step_tokens, token_adv)


# ---- trainer glue (requirement `prm_step_scores`) -----------------------------------------------------------------


def _pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    # each token's own text, special tokens as "" (they start no step and are not shown to the PRM)
    return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _step_scores_row(entry: Any, n_steps: int) -> list[float]:
    if entry is None:
        return [math.nan] * n_steps
    values = [math.nan if v is None else float(v) for v in entry]
    if len(values) != n_steps:
        raise ValueError(f"{PRM_FLAG}: the PRM returned {len(values)} step scores for a completion of {n_steps} "
                         "steps; return one score per entry of `steps` (or None for the whole completion).")
    return [math.nan] * n_steps if any(math.isnan(v) for v in values) else values


def prm_steps_for_batch(trainer: Any, output: dict[str, Any], rewards: torch.Tensor,
                        group_size: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Global `(N, T)` step ids and `(N, S)` PRM step scores of the degenerate groups' scored responses (decided on
    the global `rewards`); `(None, None)` when no group is degenerate or in evaluation (the PRM is not called).
    Each process splits and scores its own rows; both tensors are padded across processes and gathered."""
    if not trainer.model.training:
        return None, None
    degenerate = degenerate_groups(rewards.cpu(), group_size)
    trainer._metrics["train"]["groupx/verigate_step_degenerate_group_fraction"].append(degenerate.float().mean().item())
    selected = degenerate.repeat_interleave(group_size) & ~torch.isnan(rewards.cpu())
    if not selected.any():  # the same decision on every process: nobody gathers
        return None, None
    acc = trainer.accelerator
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    delimiter = trainer.args.verigate_step_delimiter
    completion_ids, mask = output["completion_ids"].cpu(), output["completion_mask"].bool().cpu()
    local_n = completion_ids.size(0)
    rows = local_selected_rows(selected, acc.process_index, local_n)
    step_ids = torch.full(completion_ids.shape, NO_STEP, dtype=torch.long)
    split = {}
    for row in rows:  # padding is never decoded: only the row's real tokens
        positions = mask[row].nonzero().flatten()
        steps, texts = token_steps(_pieces(tokenizer, completion_ids[row, positions].tolist()), delimiter)
        step_ids[row, positions] = torch.tensor(steps, dtype=torch.long)
        split[row] = texts
    asked = [row for row in rows if split[row]]  # an empty completion has no step to score
    prm = STEP_PRMS.get(trainer.args.verigate_step_prm)
    answers = call_judge_on_rows(trainer, prm, asked, output, steps=[split[row] for row in asked])
    width = max([1] + [len(split[row]) for row in asked])
    scores = torch.full((local_n, width), math.nan, dtype=torch.float32)
    for row, entry in zip(asked, answers, strict=True):
        scores[row, : len(split[row])] = torch.tensor(_step_scores_row(entry, len(split[row])))
    if acc.num_processes > 1:
        step_ids = acc.gather(acc.pad_across_processes(step_ids.to(acc.device), dim=1, pad_index=NO_STEP)).cpu()
        scores = acc.gather(acc.pad_across_processes(scores.to(acc.device), dim=1, pad_index=math.nan)).cpu()
    return step_ids, scores
