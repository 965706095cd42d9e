"""V₀ (Generalist Value Model) prompt selection: a value model predicts the policy's success rate on each candidate
prompt from a context of the run's past (prompt, success rate) pairs, and the sampling budget goes to the prompts
whose prediction is informative. Chosen through the prompt-selection seam (`prompt_sampler.py`); the context update
is the variant's rollout-filter function, which keeps every rollout.

The value model is a component the user supplies, registered by name (recipes resolve components by registered
name only, so a recipe never imports code):

    from trl_groupx.sampling.v0_value import register_value_predictor
    from v0_core.models.v0 import V0                      # Now-Join-Us/V0
    register_value_predictor("v0", V0.from_pretrained(...))
    GRPOConfig(rollout_filter="v0_value", v0_value_predictor="v0", ...)

A predictor is either an object with `predict(context_prompts, context_labels, target_prompts) -> list[float]`
(the signature of the official `V0.predict`, so a loaded V₀ plugs in as is) or a plain callable with the same
arguments. `"knn"` (built in) is a small similarity-weighted nearest-neighbour predictor for tests and toy runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..contracts import RolloutBatch
from ..registry import register
from . import keep_all
from .prompt_sampler import pending_outcomes, prompt_selection

VARIANT_ID = "v0_value"
UNSEEN_PREDICTION = 0.5  # knn: a prompt with no similar context entry is maximally uncertain (our choice)
KNN_NEIGHBOURS = 8


@runtime_checkable
class ValuePredictor(Protocol):
    """What `v0_value_predictor` names: the official `V0.predict` signature."""

    def predict(self, context_prompts: list[str], context_labels: list[float],
                target_prompts: list[str]) -> Sequence[float]: ...


_PREDICTORS: dict[str, ValuePredictor | Callable[..., Sequence[float]]] = {}


def register_value_predictor(name: str, predictor: ValuePredictor | Callable[..., Sequence[float]]) -> None:
    """Make `predictor` available as `v0_value_predictor=name` (replaces an earlier one of the same name). It must be
    deterministic: every process calls it on the same inputs and must select the same prompts."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_value_predictor: name must be a non-empty string, got {name!r}.")
    if not (isinstance(predictor, ValuePredictor) or callable(predictor)):
        raise ValueError(f"register_value_predictor({name!r}): the predictor needs a "
                         "predict(context_prompts, context_labels, target_prompts) method or must be callable so.")
    _PREDICTORS[name] = predictor


def value_predictor(name: str) -> Callable[[list[str], list[float], list[str]], Sequence[float]]:
    """The predict function registered as `name`."""
    if name not in _PREDICTORS:
        raise ValueError(f"v0_value_predictor={name!r} is not registered (registered: {sorted(_PREDICTORS)}); call "
                         "trl_groupx.sampling.v0_value.register_value_predictor(name, model) before building the "
                         "config, or use the built-in 'knn'.")
    predictor = _PREDICTORS[name]
    return predictor.predict if isinstance(predictor, ValuePredictor) else predictor


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+|[^\w\s]", text.lower()))


def knn_predict(context_prompts: list[str], context_labels: list[float], target_prompts: list[str]) -> list[float]:
    """Built-in toy predictor: `p̂ = Σ s_i r_i / Σ s_i` over the `KNN_NEIGHBOURS` context entries most similar to the
    target (Jaccard similarity `s_i` of lower-cased word/symbol sets, ties to the later entry), `r_i` their success
    rates; `UNSEEN_PREDICTION` when no context entry shares a token."""
    context = [_words(p) for p in context_prompts]
    out = []
    for target in target_prompts:
        words = _words(target)
        sims = [len(words & c) / max(len(words | c), 1) for c in context]
        order = sorted(range(len(sims)), key=lambda i: (-sims[i], -i))[:KNN_NEIGHBOURS]
        weight = sum(sims[i] for i in order)
        out.append(sum(sims[i] * context_labels[i] for i in order) / weight if weight > 0 else UNSEEN_PREDICTION)
    return out


register_value_predictor("knn", knn_predict)


def prompt_text(prompt: Any) -> str:
    """A dataset prompt as the value model's text: a string as is; a conversation's message contents joined."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)


def select_informative(p_hat: torch.Tensor, num_prompts: int, epsilon: float) -> tuple[list[int], int]:
    """Positions of the `num_prompts` candidates with the largest `p̂(1 − p̂)` among those with `ε < p̂ < 1 − ε`, largest
    first, ties to the lower position; when fewer are eligible, the rest are the skipped ones by the same order.
    Returns `(positions, number of skipped candidates used)`."""
    p = p_hat.double()
    if p.numel() < num_prompts:
        raise ValueError(f"rollout_filter='v0_value': {p.numel()} candidates for {num_prompts} prompts; raise "
                         "v0_value_pool_size (0 = the whole dataset).")
    if not torch.isfinite(p).all() or ((p < 0) | (p > 1)).any():
        raise ValueError(f"rollout_filter='v0_value': the value predictor returned {p.tolist()}; predictions must be "
                         "success rates in [0, 1].")
    score = p * (1.0 - p)
    eligible = (p > epsilon) & (p < 1.0 - epsilon)
    # eligible first, then by score, then position (stable sort on a key that ranks eligibility above any score)
    order = torch.sort(-(score + 2.0 * eligible.double()), stable=True).indices[:num_prompts]
    return order.tolist(), int((~eligible[order]).sum())


def update_context(index: torch.Tensor, rate: torch.Tensor, prompts: torch.Tensor, successes: torch.Tensor,
                   trials: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Append `(prompt, successes / trials)` for each group with a scored rollout, in batch order, dropping an older
    entry of the same prompt (the context keeps each prompt's latest rate); keep the last `size` entries."""
    index, rate = index.tolist(), rate.tolist()
    for x, s, n in zip(prompts.tolist(), successes.tolist(), trials.tolist()):
        if n == 0:
            continue  # every rollout's reward was NaN: no observation
        keep = [i for i, y in enumerate(index) if y != x]
        index, rate = [index[i] for i in keep] + [x], [rate[i] for i in keep] + [s / n]
    return torch.tensor(index[-size:], dtype=torch.int64), torch.tensor(rate[-size:], dtype=torch.float64)


def _init_state(state: dict) -> None:
    if "context_index" not in state:
        state.update(context_index=torch.zeros(0, dtype=torch.int64),
                     context_rate=torch.zeros(0, dtype=torch.float64), draws=0, skipped=0)


@prompt_selection(VARIANT_ID)
def v0_value_select(state: dict, num_prompts: int, dataset_size: int, trainer: Any = None, *, seed: int,
                    v0_value_predictor: str, v0_value_epsilon: float, v0_value_pool_size: int) -> list[int]:
    """The prompts of the next generation batch: the predictor's `p̂` on a candidate pool given the run's context,
    then `select_informative`. The pool is the whole dataset (`v0_value_pool_size=0`) or that many prompts drawn
    without replacement by a NumPy generator seeded `[seed, draws]` (same on every process and after a resume)."""
    if trainer is None:
        raise ValueError("rollout_filter='v0_value' reads the train dataset's prompts: the seam must pass `trainer`.")
    _init_state(state)
    if v0_value_pool_size and v0_value_pool_size < dataset_size:
        rng = np.random.default_rng([int(seed), int(state["draws"])])
        pool = rng.permutation(dataset_size)[:v0_value_pool_size].tolist()
    else:
        pool = list(range(dataset_size))
    state["draws"] = int(state["draws"]) + 1
    dataset = trainer.train_dataset
    text = lambda i: prompt_text(dataset[int(i)]["prompt"])  # noqa: E731
    predict = value_predictor(v0_value_predictor)
    p_hat = predict([text(i) for i in state["context_index"]], state["context_rate"].tolist(),
                    [text(i) for i in pool])
    positions, skipped = select_informative(torch.as_tensor(list(p_hat), dtype=torch.float64), num_prompts,
                                            v0_value_epsilon)
    state["skipped"] = skipped
    return [pool[i] for i in positions]


def _validate(config: Any) -> None:
    name = config.v0_value_predictor
    if not isinstance(name, str) or name not in _PREDICTORS:
        raise ValueError(f"v0_value_predictor={name!r} is not a registered value model (registered: "
                         f"{sorted(_PREDICTORS)}); register it with trl_groupx.sampling.v0_value."
                         "register_value_predictor(name, model) before building the config, or use 'knn'.")
    eps = config.v0_value_epsilon
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= eps < 0.5:
        raise ValueError(f"v0_value_epsilon={eps!r}: use a margin in [0, 0.5); predictions within it of 0 or 1 are "
                         "skipped (default 0.05).")
    for field_name, low in (("v0_value_context_size", 1), ("v0_value_pool_size", 0)):
        value = getattr(config, field_name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{field_name}={value!r}: use an integer ≥ {low} (context: 256 as in V₀'s demo; "
                             "pool: 0 = the whole dataset).")
    t = config.v0_value_success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"v0_value_success_threshold={t!r}: use a finite reward at or above which a rollout counts "
                         "as a success (1.0 for 0/1 accuracy rewards).")


@register(
    VARIANT_ID,
    name="V₀ (Generalist Value Model) prompt selection",
    paper="V_0: a Generalist Value Model estimating any policy's performance at state zero (arXiv id not in our "
          "sources), https://github.com/Now-Join-Us/V0",
    official_code="Now-Join-Us/V0@2c09c7ce1bb0df2d10d1453dabf614ec3a72377c:v0_core/models/v0.py",
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "v0_value_predictor": "knn", "v0_value_epsilon": 0.05,
           "v0_value_context_size": 256, "v0_value_pool_size": 0, "v0_value_success_threshold": 1.0},
    params=("v0_value_predictor", "v0_value_epsilon", "v0_value_context_size", "v0_value_pool_size",
            "v0_value_success_threshold"),
    stateful=True,
    validate=_validate,
)
def v0_value(
    batch: RolloutBatch,
    *,
    v0_value_success_threshold: float = 1.0,
    v0_value_context_size: int = 256,
    state: dict,
) -> torch.Tensor:
    r"""V₀: spend each generation batch's rollouts on the prompts a value model finds informative.

    Source: V₀ predicts a policy's success rate on an unseen instruction from a context of (instruction,
    performance) pairs and is used "before rollout" to schedule GRPO's sampling budget (abstract; README
    "Resource Scheduling: optimizing sampling budgets in GRPO"). Predictor interface from the official code,
    `Now-Join-Us/V0@2c09c7ce1bb0df2d10d1453dabf614ec3a72377c:v0_core/models/v0.py` (`V0.predict`, lines 182–215):
    `predict(context_prompts, context_labels, target_prompts) -> list[float]`, the probability of success (it
    binarises the context labels at 0.5); `demo.py` recommends a context of 256. The budget-allocation rule itself
    is not released: everything below about allocation is **our choice**.

    - Budget (**choice**): TRL samples a fixed `B = generation_batch_size / num_generations` prompts × `G` rollouts
      per generation batch, so the budget is allocated by prompt selection: each selected prompt gets `G`
      rollouts, every other candidate 0 (allocations sum to `B·G`).
    - Selection (`v0_value_select`, through the prompt-selection seam, after the previous batch was scored):
      `p̂_x = predict(context, x)` for every candidate `x` of the pool (whole dataset, or `v0_value_pool_size`
      drawn per batch); candidates with `p̂ ≤ ε` or `p̂ ≥ 1 − ε` (`ε = v0_value_epsilon`, **choice** 0.05) are
      skipped (all-fail / all-pass groups carry no GRPO advantage); among the rest the `B` largest `p̂(1 − p̂)`
      (the expected group-reward variance; **choice**), ties to the earlier candidate. When fewer than `B` are
      eligible the batch is filled with skipped ones by the same order (`state["skipped"]` counts them).
    - Context (**choice**: V₀'s "past instruction–performance pairs" are the run's own history): after each
      scored batch (this function, on the global rewards) each selected prompt's observed success rate `s/n`
      (a rollout succeeds when its weighted reward `≥ v0_value_success_threshold`; NaN rewards are not trials; a
      group of only NaN adds nothing) is appended, replacing that prompt's older entry; the last
      `v0_value_context_size` entries are kept. The first batch predicts from an empty context.

    Shapes: `batch.rewards (N,)`, `N = B·G` → keep `(N,)` all `True` (no rollout dropped). ±inf rewards raise.
    Without `state["pending"]` (a batch not chosen by the sampler) nothing is updated; evaluation works on a copy
    of the state.

    State (saved with every checkpoint, identical on every process): `context_index (K,)` int64 dataset indices
    and `context_rate (K,)` float64 success rates, oldest first; `draws` (pools drawn; seeds the next as
    `[args.seed, draws]`); `skipped` (ineligible prompts in the last batch); `pending (B,)` the batch being scored.

    Plugging in the real V₀: `register_value_predictor("v0", V0.from_pretrained(...))` then
    `v0_value_predictor="v0"`; with a large dataset set `v0_value_pool_size` (e.g. 4·B) to bound the predictor's
    cost. The predictor runs on every process with the same inputs and must be deterministic.

    Args:
        batch (`RolloutBatch`): the global generation batch.
        v0_value_success_threshold (`float`): reward at or above which a rollout is a success.
        v0_value_context_size (`int`): most (prompt, success rate) pairs in the context.
        state (`dict`): the context (see above), updated in place.

    Returns:
        `torch.Tensor`: `(N,)` bool, all `True`.
    """
    keep = keep_all(batch, "v0_value")
    outcomes = pending_outcomes(batch, state, "v0_value", v0_value_success_threshold)
    if outcomes is None:
        return keep
    _init_state(state)
    pending, successes, trials = outcomes
    state["context_index"], state["context_rate"] = update_context(
        state["context_index"], state["context_rate"], pending, successes, trials, v0_value_context_size)
    state["pending"] = torch.zeros(0, dtype=torch.int64)
    return keep
