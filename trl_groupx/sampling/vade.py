"""VADE: Variance-Aware Dynamic sampling via online sample-level difficulty Estimation (arXiv:2511.18902).

Per-prompt Beta posteriors on the success probability, a Thompson sampler that picks the prompts whose sampled
success probability carries the most Bernoulli variance, two-scale decay of the evidence toward the prior. The
prompts are chosen through the prompt-selection seam (`prompt_sampler.py`); the posterior update is the variant's
rollout-filter function, which keeps every rollout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..contracts import RolloutBatch
from ..registry import register
from . import keep_all
from .prompt_sampler import pending_outcomes, prompt_selection

VARIANT_ID = "vade"
PRIOR_ALPHA = PRIOR_BETA = 1.0  # uniform prior Beta(1, 1) on each prompt's success probability (our choice)


def _validate(config: Any) -> None:
    for name in ("vade_decay_slow", "vade_decay_fast"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise ValueError(f"{name}={value!r}: a decay factor must be in (0, 1] (1 = no decay; VADE recipe: "
                             "vade_decay_slow=0.99, vade_decay_fast=0.8).")
    t = config.vade_success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"vade_success_threshold={t!r}: use a finite reward value at or above which a rollout "
                         "counts as a success (1.0 for 0/1 accuracy rewards).")


def decay_toward_prior(counts: torch.Tensor, decay: float, prior: float) -> torch.Tensor:
    """`prior + decay · (counts − prior)`: keeps a fraction `decay` of the evidence beyond the prior."""
    return prior + decay * (counts - prior)


def vade_posterior_update(
    alpha: torch.Tensor,
    beta: torch.Tensor,
    prompts: torch.Tensor,
    successes: torch.Tensor,
    trials: torch.Tensor,
    decay_slow: float,
    decay_fast: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One generation batch's update of the Beta posteriors `(alpha, beta)` `(M,)` (new tensors returned).

    1. Slow scale, every prompt: `α ← α₀ + λ_slow (α − α₀)`, `β ← β₀ + λ_slow (β − β₀)`.
    2. Fast scale, each distinct prompt of the batch with a scored rollout (once, even if it occurs in several
       groups):
       `α ← α₀ + λ_fast (α − α₀)`, same for `β`.
    3. Evidence: `α_x ← α_x + s_x`, `β_x ← β_x + (n_x − s_x)`, `s_x` successes among `n_x` scored rollouts.

    `prompts (P,)` int64 dataset indices, `successes (P,)` and `trials (P,)` counts per group.
    """
    alpha = decay_toward_prior(alpha.double(), decay_slow, PRIOR_ALPHA)
    beta = decay_toward_prior(beta.double(), decay_slow, PRIOR_BETA)
    visited = torch.unique(prompts[trials > 0])  # a group with no scored rollout is no visit
    alpha[visited] = decay_toward_prior(alpha[visited], decay_fast, PRIOR_ALPHA)
    beta[visited] = decay_toward_prior(beta[visited], decay_fast, PRIOR_BETA)
    alpha.index_add_(0, prompts, successes.double())
    beta.index_add_(0, prompts, (trials - successes).double())
    return alpha, beta


def thompson_variance_scores(alpha: torch.Tensor, beta: torch.Tensor, seed: int, draw: int) -> torch.Tensor:
    """`p̃ (1 − p̃)` with `p̃_x ~ Beta(α_x, β_x)`, one draw per prompt from a NumPy generator seeded `[seed, draw]`
    (reproducible on every process and after a resume from the draw counter alone)."""
    rng = np.random.default_rng([int(seed), int(draw)])
    p = torch.from_numpy(rng.beta(alpha.double().numpy(), beta.double().numpy()))
    return p * (1.0 - p)


def select_most_informative(scores: torch.Tensor, num_prompts: int) -> list[int]:
    """Indices of the `num_prompts` largest scores, largest first; ties go to the lower index."""
    order = torch.sort(-scores, stable=True).indices
    return order[:num_prompts].tolist()


@prompt_selection(VARIANT_ID)
def vade_select(state: dict, num_prompts: int, dataset_size: int, *, seed: int) -> list[int]:
    """The prompts of the next generation batch: Thompson draw from every prompt's posterior, the `num_prompts`
    with the largest sampled variance `p̃(1 − p̃)`. Initialises the posteriors (prior) on the first call."""
    if "alpha" not in state:
        state.update(alpha=torch.full((dataset_size,), PRIOR_ALPHA, dtype=torch.float64),
                     beta=torch.full((dataset_size,), PRIOR_BETA, dtype=torch.float64), draws=0)
    if state["alpha"].numel() != dataset_size:
        raise ValueError(f"rollout_filter='vade' holds posteriors for {state['alpha'].numel()} prompts but the train "
                         f"dataset has {dataset_size}; resume with the dataset the checkpoint was trained on.")
    scores = thompson_variance_scores(state["alpha"], state["beta"], seed, state["draws"])
    state["draws"] = int(state["draws"]) + 1
    return select_most_informative(scores, num_prompts)


@register(
    VARIANT_ID,
    name="VADE (Variance-Aware Dynamic sampling via online sample-level difficulty Estimation)",
    paper="VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty Estimation for Multimodal RL, "
          "arXiv:2511.18902",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "vade_success_threshold": 1.0, "vade_decay_slow": 0.99,
           "vade_decay_fast": 0.8},
    params=("vade_success_threshold", "vade_decay_slow", "vade_decay_fast"),
    stateful=True,
    validate=_validate,
)
def vade(
    batch: RolloutBatch,
    *,
    vade_success_threshold: float = 1.0,
    vade_decay_slow: float = 0.99,
    vade_decay_fast: float = 0.8,
    state: dict,
) -> torch.Tensor:
    r"""VADE: choose each generation batch's prompts by Thompson sampling on per-prompt Beta posteriors.

    Model (paper abstract and project page https://VADE-RL.github.io; the method section was not retrievable
    here, so every formula below beyond "Beta posterior, Thompson sampler maximising information gain through
    the estimated correctness probability, two-scale prior decay" is **our choice**):

    - Posterior per dataset prompt `x`: `p_x ~ Beta(α_x, β_x)`, prior `Beta(1, 1)` (uniform).
    - Selection of generation batch `t + 1` (`vade_select`, through the prompt-selection seam, after batch `t`
      was scored): draw `p̃_x ~ Beta(α_x, β_x)` for every prompt, take the `B = generation_batch_size /
      num_generations` prompts with the largest `p̃_x (1 − p̃_x)` (the Bernoulli variance, i.e. the expected
      group-reward variance that GRPO's advantage needs; maximal at `p̃ = 1/2`), without replacement within the
      batch, with replacement across batches. **Choice**: information gain measured by `p̃(1 − p̃)`.
    - Update (this function, on the global scored batch): a rollout is a success when its weighted reward is
      `≥ vade_success_threshold`; group `j` of the batch (rows `jG … jG+G−1`) belongs to prompt
      `state["pending"][j]`; `vade_posterior_update` decays and adds `(s_x, n_x − s_x)`.
    - Two-scale decay toward the prior (**choice** of form and rates): every generation batch, all posteriors
      keep `λ_slow = vade_decay_slow` (0.99: half-life ≈ 69 batches) of their evidence, so prompts not seen for
      long drift back to uncertainty as the policy moves; a revisited prompt's old evidence is further scaled by
      `λ_fast = vade_decay_fast` (0.8) before its new group is added, so the fresh group (G rollouts of the
      current policy) outweighs older counts. Decaying toward `Beta(1, 1)` rather than toward 0 keeps every
      posterior proper.

    Shapes: `batch.rewards (N,)`, `N = B · G` → keep `(N,)` all `True` (no rollout is dropped; "no extra
    rollouts"). NaN rewards count as neither success nor trial; ±inf raises. Without `state["pending"]` (a batch
    not chosen by the sampler, e.g. the registry's contract batch) nothing is updated. Evaluation calls work on a
    copy of the state (trainer), so they never move the posteriors.

    State: `alpha`, `beta` `(M,)` float64 over the `M` dataset prompts, `draws` (Thompson draws made; seeds the
    next draw as `[args.seed, draws]`), `pending` `(B,)` int64 prompts of the batch being scored. Saved with every
    checkpoint.

    Args:
        batch (`RolloutBatch`): the global generation batch.
        vade_success_threshold (`float`): reward at or above which a rollout is a success.
        vade_decay_slow (`float`): per-batch decay factor of every posterior, in (0, 1].
        vade_decay_fast (`float`): extra decay of a revisited prompt's posterior, in (0, 1].
        state (`dict`): the posteriors (see above), updated in place.

    Returns:
        `torch.Tensor`: `(N,)` bool, all `True`.
    """
    keep = keep_all(batch, "vade")
    outcomes = pending_outcomes(batch, state, "vade", vade_success_threshold)
    if outcomes is None:
        return keep
    pending, successes, trials = outcomes
    state["alpha"], state["beta"] = vade_posterior_update(
        state["alpha"], state["beta"], pending, successes, trials, vade_decay_slow, vade_decay_fast)
    state["pending"] = torch.zeros(0, dtype=torch.int64)
    return keep
