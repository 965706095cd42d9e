"""HAPO's Adaptive Temperature Sampling (`hapo_adaptive_temperature=True`): every completion token is sampled at a
temperature computed from the entropy of its own next-token distribution, higher where that entropy is high.

HAPO ("HAPO: Heterogeneous Adaptive Policy Optimization", https://github.com/starriver030515/HAPO): "Adaptive
Temperature Sampling ... adjusts sampling temperature in real time, promoting exploration at high-entropy tokens
while preserving coherence at low-entropy ones".
Official code: starriver030515/HAPO@7671dde3e268779a949954ec75ed3edda45f7e0a

- `vllm/v1/sample/sampler.py` l.108-144 (`Sampler.sample`, inner `compute_entropy_based_temperature`): a patched
  vLLM sampler. At every decoding step, from the float32 logits after vLLM's penalties and before temperature,
  top-k/top-p and min-p: `H` = entropy of `softmax(logits)`, `ℓ = log max(H, 1e-6)`, `h = (ℓ − m)/(s + 1e-6)`,
  `ĥ = h·scale_pos` if `h > 0`, `h·scale_neg` if `h ≤ 0` (0 if `h` is NaN), clamped to [−1, 1], and the row's
  temperature `T·(1 + τ ĥ)` (τ = `temperature_tau`, 0.05) divides its logits; min-p, top-k and top-p follow.
- `verl/trainer/ppo/ray_trainer.py` l.939-963 and l.1020-1027 (`fit`): the statistics `(m, s, scale_pos,
  scale_neg)` ("norm_entropys") are computed once per training step, by `core_algos.compute_entropy_h` on the
  entropies that the old-log-prob pass (`compute_log_prob`, the rollout policy at the rollout temperature `T`:
  `verl/workers/actor/dp_actor.py` l.227-231 divides the logits by `T` before the entropy) returns for all
  response tokens of that step's batch, and handed to the *next* step's generation (`gen_batch.meta_info`); the
  first step has none and samples at `T` throughout. Validation turns the adaptive temperature off
  (`verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py` l.271-281).
- `verl/trainer/ppo/core_algos.py` l.86-128 (`compute_entropy_h`, eps 1e-8): `ℓ = log max(H, 1e-8)`,
  `m` = the `entropy_pivot` quantile (0.8, "nearest") of `ℓ` over the batch's response tokens, `s =
  sqrt(max(mean (ℓ − m)², 1e-8))`, `scale_pos = 1/max(max h⁺, 1e-8)`, `scale_neg = 1/min(min h⁻, −1e-8)` with
  `h = (ℓ − m)/s`.
- Recipes (`recipe/*.sh`, `verl/trainer/config/ppo_trainer.yaml` l.320-335): `adaptive_temperature=True`,
  `temperature_tau=0.05`, `temperature=1.0`, `entropy_pivot=0.8`.

Here (transformers `generate`, TRL's `_generate_single_turn`): `EntropyAdaptiveTemperature` is a transformers
`LogitsProcessor`. transformers 5 runs custom processors after its own penalty processors and before its sampling
warpers (`GenerationMixin._get_logits_processor`: the custom list is merged before `TemperatureLogitsWarper`,
`TopK`, `TopP`, `MinP`), so the processor sees the logits where vLLM's sampler computes the entropy, divides each
row by `1 + τ ĥ`, and transformers' temperature warper then divides by `T`: the row is sampled at `T (1 + τ ĥ)`,
then top-k/top-p as in vLLM. TRL calls `unwrapped_model.generate(**inputs, generation_config=...)` without a
`logits_processor` argument (trl 1.16 `GRPOTrainer._generate_single_turn`), so for the duration of each training
generation call the unwrapped model's `generate` is shadowed by one that appends the processor
(`generate_with_adaptive_temperature`; removed afterwards). The same processor records each real completion token's
entropy at TRL's `temperature` (what the official old-log-prob pass measures); at the end of the generation batch
(`update_entropy_statistics`) the statistics are computed over every process's tokens and kept in
`trainer.variant_state` for the next batch (saved with checkpoints, so a resumed run's first batch uses the
statistics of the last batch before the checkpoint, not the base temperature).

Log-probs: TRL computes the ratio's, KL's and entropies' log-probs with a forward at its single `temperature`
(logits / `temperature`), not at the per-token temperature that drew the token: as the official code, whose
`old_log_prob` and actor log-probs are computed at the rollout temperature (`dp_actor.py` l.227, l.288) and whose
vLLM log-probs only feed a diagnostic. So with `num_iterations=1` the ratio is exactly 1 on the first update.

Paper vs code, and choices:
- Sign (`hapo_temperature_official_sign`, default False = the paper): `scale_neg = 1/neg_min` with `neg_min < 0`
  makes `ĥ = |h|/|neg_min| ≥ 0` for every `h ≤ 0`, so the official sampler only ever raises the temperature, and
  raises it as much at the lowest-entropy tokens as at the highest (`T ≤ T_t ≤ T (1 + τ)`). The paper's
  description (exploration at high-entropy tokens, coherence at low-entropy ones) needs the signed `ĥ ∈ [−1, 1]`:
  `False` divides by `|neg_min|`, so low-entropy tokens are sampled colder (`T (1 − τ) ≤ T_t ≤ T (1 + τ)`, hence
  τ < 1). The paper wins by default, as for HAPO's token stage (`token_weighting="hapo"`) and clip
  (`hapo_clip_official_sign=False`), so the three parts read the entropy the same way; `True` reproduces the code.
- Two entropies, as in the code: the statistics are of entropies at `T` (`dp_actor`), the per-step entropy of the
  raw logits (vLLM sampler); they coincide at the official `T = 1`.
- The recorded entropies are those of the logits the processor sees, i.e. after any generation penalty
  (`repetition_penalty`, ...; TRL's defaults have none), where the official statistics come from a forward without
  penalties; and they come from the generation's KV-cached forward (equal to a full forward up to float noise, see
  `tests/integration/test_hapo_adaptive_temperature.py`), with no second forward.
- A token whose logits another processor set to −inf (e.g. `suppress_tokens`) counts `0·log 0 = 0` in the entropy
  (the official `probs * log_probs` gives NaN there, hence ĥ = 0).
- Where the statistics come from: the sampled completions of the previous training generation batch (all
  processes), each real token (up to and including the first EOS) once; extra baseline completions
  (remax/aapo) and evaluation generations neither use nor feed them. iGRPO's stage-1 drafts are training
  generations of the same policy and count. A batch without any completion token keeps the previous statistics.
- `hapo_temperature_entropy_pivot` is its own field (the official code shares `actor.entropy_pivot` with the clip
  and DAR; set the three pivots equal for that).
- vLLM (`use_vllm=True`) is refused: the official code patches vLLM's sampler, which TRL's vLLM client does not
  expose. `use_transformers_continuous_batching=True` is refused too (it takes no logits processor from TRL), and
  so is a trainer with a `rollout_func` (it generates outside TRL's `_generate_single_turn`; at construction).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from transformers import LogitsProcessor, LogitsProcessorList

FLAG = "hapo_adaptive_temperature"
STATE_KEY = "hapo/adaptive_temperature"  # the statistics in `trainer.variant_state`, saved with checkpoints
_STATS_EPS = 1e-8  # official compute_entropy_h `eps` (log floor, variance floor, scale floors)
_SAMPLER_EPS = 1e-6  # official compute_entropy_based_temperature `eps` (log floor, added to s)
_OWN_FIELDS = {"hapo_temperature_tau": 0.05, "hapo_temperature_entropy_pivot": 0.8,
               "hapo_temperature_official_sign": False}


class EntropyStatistics(NamedTuple):
    """The official `norm_entropys`, with the scales kept as the extremes they invert: `scale_pos = 1/pos_max`,
    `scale_neg = 1/neg_min` (`neg_min < 0`)."""

    median: float
    std: float
    pos_max: float
    neg_min: float


def validate(config: Any) -> None:
    """Config-time checks of `hapo_adaptive_temperature` and its fields."""
    if not getattr(config, FLAG, False):
        changed = [n for n, d in _OWN_FIELDS.items() if getattr(config, n, d) != d]
        if changed:
            raise ValueError(f"{changed[0]}={getattr(config, changed[0])!r} only applies with {FLAG}=True; set "
                             f"{FLAG}=True or leave {changed[0]} at its default.")
        return
    tau, official = config.hapo_temperature_tau, config.hapo_temperature_official_sign
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau < 0:
        raise ValueError(f"hapo_temperature_tau must be a finite number >= 0 (official temperature_tau 0.05), "
                         f"got {tau!r}.")
    if not official and tau >= 1:
        raise ValueError(f"hapo_temperature_tau={tau!r} with hapo_temperature_official_sign=False can make the "
                         "temperature T(1 - tau) <= 0 at the lowest-entropy tokens; use tau < 1 (official 0.05).")
    pivot = config.hapo_temperature_entropy_pivot
    if isinstance(pivot, bool) or not isinstance(pivot, (int, float)) or not 0.0 <= pivot <= 1.0:
        raise ValueError(f"hapo_temperature_entropy_pivot must lie in [0, 1] (a quantile; official entropy_pivot "
                         f"0.8), got {pivot!r}.")
    for flag in ("use_vllm", "use_transformers_continuous_batching"):
        if getattr(config, flag, False):
            raise ValueError(
                f"{FLAG}=True samples through a transformers logits processor and does not run with {flag}=True (the "
                "official code patches vLLM's own sampler, vllm/v1/sample/sampler.py, which TRL's vLLM path does not "
                f"expose). Set {flag}=False or {FLAG}=False."
            )


def check_generation_path(trainer: Any) -> None:
    """Construction-time check: the processor rides on TRL's own `_generate_single_turn`, which a `rollout_func`
    replaces."""
    if getattr(trainer, "rollout_func", None) is not None:
        raise ValueError(f"{FLAG}=True applies a logits processor to TRL's own generation, but this trainer has a "
                         f"rollout_func that generates on its own; drop the rollout_func or set {FLAG}=False.")


def entropy_statistics(entropies: torch.Tensor, pivot: float) -> EntropyStatistics | None:
    """The official `compute_entropy_h` statistics of the 1-D `entropies` of a batch's real completion tokens (at
    the rollout temperature); `None` for an empty batch."""
    if entropies.numel() == 0:
        return None
    log_h = torch.log(entropies.detach().double().clamp(min=_STATS_EPS))
    ordered = log_h.sort().values
    median = ordered[round(pivot * (ordered.numel() - 1))]  # "nearest" quantile (Python's round, as the official)
    h = log_h - median
    std = (h.pow(2).mean()).clamp(min=_STATS_EPS).sqrt()
    h = h / std
    pos_max = h[h > 0].max() if (h > 0).any() else h.new_zeros(())
    neg_min = h[h < 0].min() if (h < 0).any() else h.new_zeros(())
    return EntropyStatistics(median.item(), std.item(), pos_max.clamp(min=_STATS_EPS).item(),
                             neg_min.clamp(max=-_STATS_EPS).item())


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """`(..., V)` logits → `(...)` entropy of their softmax in float32, with `0·log 0 = 0` (−inf logits)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    p = log_p.exp()
    return -(p * log_p.masked_fill(p == 0, 0.0)).sum(-1)


def normalised_entropy(entropy: torch.Tensor, stats: EntropyStatistics, official_sign: bool) -> torch.Tensor:
    """`ĥ ∈ [−1, 1]` of each entropy under the previous batch's statistics (official sampler; see the module)."""
    h = (torch.log(entropy.clamp(min=_SAMPLER_EPS)) - stats.median) / (stats.std + _SAMPLER_EPS)
    scale_neg = 1.0 / stats.neg_min if official_sign else -1.0 / stats.neg_min
    h_hat = torch.where(h > 0, h / stats.pos_max, torch.where(h <= 0, h * scale_neg, torch.zeros_like(h)))
    return h_hat.clamp(-1.0, 1.0)


def temperature_scale(logits: torch.Tensor, stats: EntropyStatistics, tau: float, official_sign: bool) -> torch.Tensor:
    """`(B, V)` logits → `(B,)` factor `1 + τ ĥ` by which each row's sampling temperature is multiplied."""
    return 1.0 + tau * normalised_entropy(token_entropy(logits), stats, official_sign)


def entropy_based_temperature(logits: torch.Tensor, temperature: float | torch.Tensor, stats: EntropyStatistics | None,
                              tau: float, official_sign: bool = True) -> torch.Tensor:
    """`(B,)` per-row temperature `T (1 + τ ĥ)` of one decoding step (official
    `compute_entropy_based_temperature`); `T` when there are no statistics yet."""
    base = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(logits.shape[0])
    if stats is None:
        return base.clone()
    return base * temperature_scale(logits, stats, tau, official_sign)


class EntropyAdaptiveTemperature(LogitsProcessor):
    """Divides each row's logits by `1 + τ ĥ` of its own next-token entropy (no-op without statistics), and
    records, per step, every row's entropy at `record_temperature` (for the next batch's statistics) and the factor.

    Placed among the custom processors, it runs before transformers' temperature and top-k/top-p warpers, so the
    row is sampled at `T (1 + τ ĥ)`. It uses no randomness: with τ = 0 sampling is bit-identical to plain sampling.
    """

    def __init__(self, stats: EntropyStatistics | None, tau: float, official_sign: bool, record_temperature: float):
        self.stats, self.tau, self.official_sign = stats, float(tau), bool(official_sign)
        self.record_temperature = float(record_temperature)
        self.entropies: list[torch.Tensor] = []  # per step, (B,) entropy at record_temperature
        self.scales: list[torch.Tensor] = []  # per step, (B,) factor 1 + τĥ (only with statistics)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        raw_entropy = token_entropy(scores)
        recorded = raw_entropy if self.record_temperature == 1.0 else token_entropy(scores / self.record_temperature)
        self.entropies.append(recorded.detach())
        if self.stats is None:
            return scores
        scale = 1.0 + self.tau * normalised_entropy(raw_entropy, self.stats, self.official_sign)
        self.scales.append(scale.detach())
        return scores / scale.to(scores.dtype)[:, None]


class _Records:
    """The current generation batch's real-token entropies and factors on this process."""

    def __init__(self) -> None:
        self.entropies: list[torch.Tensor] = []
        self.scales: list[torch.Tensor] = []


def _records(trainer: Any) -> _Records:
    if not isinstance(getattr(trainer, "_hapo_temperature_records", None), _Records):
        trainer._hapo_temperature_records = _Records()
    return trainer._hapo_temperature_records


def completion_token_mask(completion_ids: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """`(B, L)` mask of the real tokens of generated rows: up to and including the first EOS (as TRL masks them)."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    return ~after_eos


def stored_statistics(trainer: Any) -> EntropyStatistics | None:
    stored = trainer.variant_state.get(STATE_KEY) or {}
    return EntropyStatistics(**{k: float(stored[k]) for k in EntropyStatistics._fields}) if stored else None


@contextlib.contextmanager
def _appended_to_generate(
    model: Any, make_processor: Callable[[], EntropyAdaptiveTemperature],
    on_done: Callable[[EntropyAdaptiveTemperature, torch.Tensor, torch.Tensor], None],
) -> Iterator[None]:
    """Shadow `model.generate` (instance attribute) with one that appends a fresh processor to each call."""
    shadowed = "generate" in vars(model)
    original = model.generate

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Any:
        processor = make_processor()
        kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), processor])
        output = original(*args, **kwargs)
        prompt = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(output, torch.Tensor) and isinstance(prompt, torch.Tensor):
            on_done(processor, output[:, prompt.shape[1]:], prompt)
        return output

    model.generate = generate
    try:
        yield
    finally:
        if shadowed:
            model.generate = original
        else:
            del model.generate


def generate_with_adaptive_temperature(trainer: Any, generate: Callable[..., tuple[list, Any]], *args: Any,
                                       **kwargs: Any) -> tuple[list, Any]:
    """`generate(*args, **kwargs)` (TRL's `_generate_single_turn`) with `EntropyAdaptiveTemperature` on every
    transformers `generate` call it makes; the real tokens' entropies are kept for `update_entropy_statistics`."""
    args_ = trainer.args
    stats = stored_statistics(trainer)
    records = _records(trainer)

    def make_processor() -> EntropyAdaptiveTemperature:
        return EntropyAdaptiveTemperature(stats, args_.hapo_temperature_tau, args_.hapo_temperature_official_sign,
                                          trainer.temperature)

    def keep(processor: EntropyAdaptiveTemperature, completion_ids: torch.Tensor, prompt: torch.Tensor) -> None:
        steps = min(len(processor.entropies), completion_ids.shape[1])
        if steps == 0:
            return
        mask = completion_token_mask(completion_ids[:, :steps], trainer.eos_token_ids)
        records.entropies.append(torch.stack(processor.entropies[:steps], 1)[mask])
        if processor.scales:
            records.scales.append(torch.stack(processor.scales[:steps], 1)[mask])

    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)  # what TRL's unwrap_model_for_generation yields
    with _appended_to_generate(model, make_processor, keep):
        return generate(*args, **kwargs)


def _gather_flat(trainer: Any, values: list[torch.Tensor]) -> torch.Tensor:
    device = trainer.accelerator.device
    local = torch.cat(values).float().to(device) if values else torch.zeros(0, device=device)
    if trainer.accelerator.num_processes == 1:
        return local
    padded = trainer.accelerator.pad_across_processes(local, dim=0, pad_index=float("nan"))
    gathered = trainer.accelerator.gather(padded)
    return gathered[~torch.isnan(gathered)]


def update_entropy_statistics(trainer: Any) -> None:
    """End of a training generation batch (every process): this batch's statistics become the next batch's, and the
    applied factors are logged (`hapo/temperature_scale_{mean,min,max}`, over every process's tokens)."""
    records = _records(trainer)
    entropies = _gather_flat(trainer, records.entropies)
    scales = _gather_flat(trainer, records.scales)
    records.entropies.clear()
    records.scales.clear()
    stats = entropy_statistics(entropies, trainer.args.hapo_temperature_entropy_pivot)
    if stats is not None:
        state = trainer.variant_state[STATE_KEY]
        state.clear()
        state.update(stats._asdict())
    if scales.numel():
        metrics = trainer._metrics["train"]
        metrics["hapo/temperature_scale_mean"].append(scales.mean().item())
        metrics["hapo/temperature_scale_min"].append(scales.min().item())
        metrics["hapo/temperature_scale_max"].append(scales.max().item())
