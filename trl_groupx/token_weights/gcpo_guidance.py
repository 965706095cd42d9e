"""GCPO (Guidance Contrastive Policy Optimization): per-token weights from the contrast between the log-probability of
each generated token under the real prompt and under a negative ("give the wrong answer") prompt."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, clean_advantages

_OFFICIAL = "jacklishufan/gcpo@e0f183de1ddad5714587be3eaed5b01be44724ee"
# Official `create_negative_prompt` (verl/utils/dataset.py) for negative_prompt_type="wrong_answer" without a template
# file: the raw prompt text followed by this suffix.
DEFAULT_NEGATIVE_TEMPLATE = "{prompt}, but generate the wrong answer"
PROMPT_PLACEHOLDER = "{prompt}"
TIE_MODES = ("position", "average")
_LOG_RATIO_CLAMP = 20.0  # official clamp of lp_neg − lp_pos before exp
_DIVERGENCE_CLAMP = 10.0  # official clamp of the k3 divergence


def _validate(config) -> None:
    x, y = config.gcpo_guidance_top_fraction, config.gcpo_guidance_top_mass
    if not (isinstance(x, (int, float)) and 0.0 < x < 1.0):
        raise ValueError(f"gcpo_guidance_top_fraction must be in (0, 1) (the official x = 0.4), got {x!r}.")
    if not (isinstance(y, (int, float)) and 0.0 < y < 1.0):
        raise ValueError(f"gcpo_guidance_top_mass must be in (0, 1) (the official y = 0.8), got {y!r}.")
    if rank_power_alpha(x, y) < 0:
        raise ValueError(
            f"gcpo_guidance_top_mass={y!r} is below gcpo_guidance_top_fraction={x!r}: the power law would give "
            "the top-ranked tokens less than their share of the weight; choose top_mass >= top_fraction (0.4/0.8)."
        )
    if config.gcpo_guidance_ties not in TIE_MODES:
        raise ValueError(f"gcpo_guidance_ties must be one of {TIE_MODES}, got {config.gcpo_guidance_ties!r}.")
    template = config.gcpo_guidance_negative_template
    if not isinstance(template, str) or not template.strip():
        raise ValueError(
            "gcpo_guidance_negative_template must be a non-empty string; '{prompt}' in it is replaced by the row's "
            f"prompt text (default {DEFAULT_NEGATIVE_TEMPLATE!r}), got {template!r}."
        )
    if config.gcpo_guidance_negative_prompt_fn is not None:
        resolve_negative_prompt_fn(config.gcpo_guidance_negative_prompt_fn)


def rank_power_alpha(top_fraction: float, top_mass: float) -> float:
    """Official `alpha = log(1 − y) / log(1 − x) − 1`: with weights `p^α` on percentiles `p`, the top `x` of the
    tokens carry (in the continuum limit) the fraction `y` of the weight. x = 0.4, y = 0.8 give α ≈ 2.1507."""
    return math.log(1.0 - top_mass) / math.log(1.0 - top_fraction) - 1.0


def guidance_divergence(logps: torch.Tensor, negative_logps: torch.Tensor) -> torch.Tensor:
    """Official k3 divergence per token: `d = clamp(lp_neg − lp_pos, ±20)`, `D = clamp(e^d − d − 1, ±10)`
    (≥ 0, and 0 iff both prompts give the token the same probability)."""
    d = (negative_logps - logps).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (d.exp() - d - 1.0).clamp(-_DIVERGENCE_CLAMP, _DIVERGENCE_CLAMP)


def _ranks(values: torch.Tensor, ties: str) -> torch.Tensor:
    """1-based ranks, lowest value first. `"position"`: ties broken by token position (a stable sort, which is what
    the official `argsort` gives on equal values); `"average"`: tied values share their mean rank."""
    n = values.numel()
    order = torch.sort(values, stable=True).indices
    ranks = torch.empty(n, dtype=values.dtype, device=values.device)
    ranks[order] = torch.arange(1, n + 1, dtype=values.dtype, device=values.device)
    if ties == "average":
        _, inverse, counts = torch.unique(values, return_inverse=True, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts  # number of strictly smaller values per unique value
        ranks = (starts + (counts + 1) / 2.0).to(values.dtype)[inverse]
    return ranks


def rank_power_weights(divergence: torch.Tensor, mask: torch.Tensor, alpha: float, ties: str = "position"):
    """Official "hist" normalisation per completion over its real tokens: rank `r ∈ 1..n` (lowest divergence first),
    percentile `p = r / n`, `w = p^α`, rescaled to mean 1 (`w · n / Σ w`). 0 on padding, which is never read."""
    weights = torch.zeros_like(divergence)
    real = mask.bool()
    for i in range(divergence.shape[0]):
        values = divergence[i][real[i]]
        n = values.numel()
        if n == 0:
            continue
        w = (_ranks(values, ties) / n).pow(alpha)
        weights[i][real[i]] = w / w.sum() * n
    return weights


@register(
    "gcpo_guidance",
    name="GCPO (Guidance Contrastive Policy Optimization)",
    paper="Guidance Contrastive Token Credit Assignment for Discrete Policy Optimization (GCPO), "
          "https://github.com/jacklishufan/gcpo (no arXiv id in the abstract or the official README)",
    official_code=f"{_OFFICIAL}:verl/workers/actor/dp_actor.py",
    stage="token_weights",
    # Official examples/gcpo_7b.sh + examples/configs/config_vlm.yaml: clip 0.2/0.28, dual-clip c = 3 (EasyR1's
    # default clip_ratio_dual), token-mean loss over the mini-batch, low-variance (k3) KL loss with coefficient 1e-2.
    flags={"token_weighting": "gcpo_guidance", "gcpo_guidance_top_fraction": 0.4, "gcpo_guidance_top_mass": 0.8,
           "gcpo_guidance_ties": "position", "gcpo_guidance_negative_template": DEFAULT_NEGATIVE_TEMPLATE,
           "loss_type": "dual_clip", "dual_clip_c": 3.0, "epsilon": 0.2, "epsilon_high": 0.28,
           "loss_aggregation": "global_token_mean", "beta": 0.01},
    needs=("negative prompt: gcpo_guidance_negative_template or gcpo_guidance_negative_prompt_fn",),
    requires=("old_logps", "contrast_logps"),
    params=("gcpo_guidance_top_fraction", "gcpo_guidance_top_mass", "gcpo_guidance_ties",
            "gcpo_guidance_negative_template", "gcpo_guidance_negative_prompt_fn"),
    validate=_validate,
)
def gcpo_guidance_token_advantages(
    advantages: torch.Tensor, ctx: TokenContext, *, gcpo_guidance_top_fraction: float, gcpo_guidance_top_mass: float,
    gcpo_guidance_ties: str,
) -> torch.Tensor:
    r"""GCPO token weights: each token's sequence advantage times a weight from the rank of its guidance divergence.

        d_{i,t} = clamp(log π(y_t | neg_i, y_<t) − log π(y_t | q_i, y_<t), −20, 20)
        D_{i,t} = clamp(e^{d} − d − 1, −10, 10)                                 (k3 estimator, ≥ 0)
        p_{i,t} = rank of D_{i,t} among the real tokens of completion i (1 = lowest) / n_i
        w_{i,t} = n_i · p_{i,t}^α / Σ_s p_{i,s}^α,   α = log(1 − y) / log(1 − x) − 1  (x=.4, y=.8: α ≈ 2.1507)
        A_{i,t} = A_i · w_{i,t}

    Shapes: `advantages (N,)`, `ctx.logps` and `ctx.contrast_logps` `(N, T)` (positive and negative prompt),
    output `(N, T)`, 0 on padding. Every weight is positive and the weights of a completion average 1, so each token
    keeps its sequence's sign and the completion's mean advantage is unchanged; the token whose probability the
    negative prompt changes most gets the largest |A|.

    Official code: `jacklishufan/gcpo@e0f183de1ddad5714587be3eaed5b01be44724ee`,
    `verl/workers/actor/dp_actor.py` `compute_importance_weights` (l. 200-240, "kl" divergence, "hist" weights)
    and `update_policy` (`advantages * weights`); the negative prompt is
    `create_negative_prompt` in `verl/utils/dataset.py` (l. 469-486) and `negative_format_prompt` templates
    (`examples/format_prompt/math_format_perception_wrong_answer.jinja`), its completion re-attached in
    `verl/trainer/ray_trainer.py` (l. 690-705).

    Choices:
      * Identical prompts. Then D ≡ 0, every rank is a tie, and the official `argsort` ranks equal values by
        position (torch's default sort does not promise it, but does so on such inputs): the weights become a ramp
        increasing along the completion, not GRPO's uniform weights, so the catalog's check "pos == neg → GRPO"
        does not hold for the official code. `gcpo_guidance_ties="position"` (default) is the official behaviour,
        made deterministic with a stable sort; `"average"` gives tied tokens their mean rank, so
        identical prompts give weight 1 everywhere (GRPO) and other ties are shared rather than ordered.
      * Which positive log-probs. The official code contrasts the *current* policy's log-probs in each update
        micro-batch with the negative prompt's under the same model; here both come from one no-grad forward each
        at generation time under the rollout policy (`old_logps`, `contrast_logps`), once per generation batch.
        With `num_iterations=1` (no reuse of rollouts) the two coincide.
      * A NaN divergence on a real token (a broken log-prob) is read as 0 (no contrast) so the weights stay finite;
        rollouts with a NaN reward get advantage 0, hence token advantages 0.
      * The negative prompt (`negative_prompt_logps`): `gcpo_guidance_negative_template` applied to the row's prompt
        text (the last user message of a conversation; default = the official code's built-in "wrong_answer"
        suffix), or a user function named by `gcpo_guidance_negative_prompt_fn`. It is tokenised by the trainer's
        own `_tokenize_prompts` (chat template, tools) and left-padded, and not truncated: TRL 1.16 does not
        truncate prompts (the official dataset truncates both prompts to `max_prompt_length`). Text prompts only;
        `environment_factory` runs and image prompts are refused at the first step (the official "empty_image"
        negative is not implemented).
    """
    if ctx.logps is None or ctx.contrast_logps is None:
        raise ValueError("token_weighting='gcpo_guidance' needs the rollout log-probs under the real and the negative "
                         "prompt (requirements 'old_logps' and 'contrast_logps').")
    n = ctx.completion_mask.shape[0]
    check_groups(n, ctx.group_size)
    adv = clean_advantages("gcpo_guidance", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    logps = torch.where(mask, ctx.logps.float(), 0.0)  # padding never enters: both sides 0 there
    negative = torch.where(mask, ctx.contrast_logps.float(), 0.0)
    divergence = torch.nan_to_num(guidance_divergence(logps, negative), nan=0.0)
    alpha = rank_power_alpha(gcpo_guidance_top_fraction, gcpo_guidance_top_mass)
    weights = rank_power_weights(divergence, mask, alpha, gcpo_guidance_ties)
    return adv.to(weights.device)[:, None] * weights


# --- negative prompts -------------------------------------------------------------------------------------------


def resolve_negative_prompt_fn(path: str) -> Callable[[Any], Any]:
    """The callable named by a dotted import path `"package.module.function"` (or `"package.module:function"`)."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"gcpo_guidance_negative_prompt_fn must be a dotted import path string, got {path!r}.")
    module, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep or not module or not attr:
        raise ValueError(f"gcpo_guidance_negative_prompt_fn={path!r} is not 'package.module.function'.")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"gcpo_guidance_negative_prompt_fn={path!r} cannot be imported: {err}.") from None
    if not callable(fn):
        raise ValueError(f"gcpo_guidance_negative_prompt_fn={path!r} is not callable.")
    return fn


def apply_negative_template(prompt: Any, template: str) -> Any:
    """The negative version of one dataset prompt: `template` with `{prompt}` replaced by the prompt text.

    A plain-text prompt is rewritten whole; a conversational prompt (list of messages) gets its last user message
    rewritten (its last text part when the content is a list of parts), as the official dataset rewrites the raw
    question before the chat template is applied. The input is never mutated."""
    if isinstance(prompt, str):
        return template.replace(PROMPT_PLACEHOLDER, prompt)
    messages = [dict(m) for m in prompt]
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            message["content"] = template.replace(PROMPT_PLACEHOLDER, content)
            return messages
        parts = [dict(p) for p in content]
        for part in reversed(parts):
            if part.get("type") == "text":
                part["text"] = template.replace(PROMPT_PLACEHOLDER, part["text"])
                message["content"] = parts
                return messages
    raise ValueError("token_weighting='gcpo_guidance': a conversational prompt has no user text message to turn into "
                     "the negative prompt; set gcpo_guidance_negative_prompt_fn to build it yourself.")


def negative_prompts(prompts: list[Any], config: Any) -> list[Any]:
    """One negative prompt per row: `gcpo_guidance_negative_prompt_fn(prompt)` when set, else the template."""
    path = getattr(config, "gcpo_guidance_negative_prompt_fn", None)
    if path is not None:
        fn = resolve_negative_prompt_fn(path)
        return [fn(p) for p in prompts]
    return [apply_negative_template(p, config.gcpo_guidance_negative_template) for p in prompts]


def negative_prompt_logps(trainer: Any, output: dict[str, Any], prompts: list[Any]) -> torch.Tensor:
    """`(B, T)` no-grad log-probs of this process's completions re-attached to the negative prompts of `prompts`
    (one per local row), under the training model, tokenised as the trainer tokenises prompts (chat template,
    left padding) and run through its own `_get_per_token_logps_and_entropies` (so `logps_chunk_size` and
    `prefix_grouper` apply)."""
    from trl.trainer.utils import pad

    if trainer.environment_factories is not None or any(k in output for k in ("pixel_values", "image_grid_thw")):
        raise ValueError("token_weighting='gcpo_guidance' supports text prompts without environments: the negative "
                         "prompt is rebuilt from the dataset's prompt column only.")
    negatives = negative_prompts(prompts, trainer.args)
    prompt_ids_list, _, _ = trainer._tokenize_prompts(negatives)
    device = output["completion_ids"].device
    ids = [torch.as_tensor(p, dtype=torch.long) for p in prompt_ids_list]
    neg_ids = pad(ids, padding_value=trainer._tokenizer.pad_token_id, padding_side="left").to(device)
    neg_mask = pad([torch.ones_like(x) for x in ids], padding_value=0, padding_side="left").to(device)
    completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([neg_ids, completion_ids], dim=1), torch.cat([neg_mask, completion_mask], dim=1),
            completion_ids.size(1), batch_size=trainer.args.per_device_train_batch_size, compute_entropy=False,
        )
    return logps
