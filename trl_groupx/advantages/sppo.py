"""SPPO (Sequence-Level PPO): reasoning as a sequence-level contextual bandit; one rollout per prompt, whose baseline
is a decoupled scalar value `σ(V(x))` of the prompt, learned by a separate value model with binary cross-entropy.

The pure advantage is here; the value model (loading, scoring the prompts, its BCE update, its checkpointed state)
is the trainer's requirement `prompt_value_logits`, in `sppo_value.py`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from ..registry import register

SPPO_ID = "sppo"


def check_unit_interval_rewards(rewards: torch.Tensor) -> None:
    """SPPO's value model is trained with BCE against the rewards, so every scored reward must lie in [0, 1]
    (NaN = unscored, allowed); anything else (±inf included) is a `ValueError` naming the fix."""
    scored = rewards[~torch.isnan(rewards)]
    bad = scored[(scored < 0) | (scored > 1)]
    if bad.numel():
        raise ValueError(
            f"advantage_estimator='sppo' trains its value model with binary cross-entropy on the rewards, so every "
            f"reward must lie in [0, 1] (a success probability); got {bad[:5].tolist()}. Use 0/1 verifiable rewards, "
            "or scale the reward functions (reward_weights summing to 1 over [0, 1] rewards)."
        )


def _validate(config: Any) -> None:
    lr = config.sppo_value_lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(
            f"sppo_value_lr must be a finite number > 0 (the value model's AdamW learning rate; official 5e-6), "
            f"got {lr!r}."
        )
    path = config.sppo_value_model
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise ValueError(
            "sppo_value_model must be a model id or a local path (a causal LM with the policy's tokenizer, e.g. the "
            f"policy's own checkpoint, given a scalar value head), got {path!r}."
        )
    size = config.sppo_value_mini_batch_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(
            "sppo_value_mini_batch_size must be None (one value-model step per generation batch) or an int >= 1 "
            f"(rows of the global generation batch per value-model step; official 128 of 256), got {size!r}."
        )


class _OneRollout(int):
    """The int 1 that passes TRL's `num_generations < 2` refusal; every other comparison is the int's."""

    def __lt__(self, other: object) -> bool:
        return False if other == 2 else int.__lt__(self, other)  # type: ignore[operator]


@contextlib.contextmanager
def allow_one_rollout(config: Any) -> Iterator[None]:
    """Around TRL's `GRPOConfig.__post_init__`: let `advantage_estimator='sppo'` run with `num_generations=1`.

    TRL refuses a group of one for every run (no group baseline exists); SPPO's baseline is the value model, and the
    official runs sample one response per prompt (`actor_rollout_ref.rollout.n`, verl's default 1, in every
    sustech-nlp/SPPO@55e8a7236dabbd7c421ab987eebeb1a067b4c436 `run_scripts/*.sh`). Every other variant keeps TRL's
    refusal (`tests/unit/test_config.py`). TRL's other uses of `num_generations` in its config (the generation and
    evaluation batches must hold whole groups) hold trivially for 1.
    """
    single = getattr(config, "advantage_estimator", None) == SPPO_ID and config.num_generations == 1
    if single:
        config.num_generations = _OneRollout(1)
    try:
        yield
    finally:
        if single:
            config.num_generations = 1


@register(
    SPPO_ID,
    name="SPPO (Sequence-Level PPO)",
    paper="SPPO: Sequence-Level PPO for Long-Horizon Reasoning Tasks, arXiv:2604.08865",
    official_code="sustech-nlp/SPPO@55e8a7236dabbd7c421ab987eebeb1a067b4c436:verl/trainer/ppo/core_algos.py",
    stage="advantages",
    flags={"advantage_estimator": SPPO_ID, "num_generations": 1, "sppo_value_lr": 5e-6, "loss_type": "dapo",
           "temperature": 0.6},
    needs=(("a value model (sppo_value_model: a causal LM with the policy's tokenizer, e.g. the policy's own "
            "checkpoint; the trainer gives it a scalar head and trains it with BCE on the rewards)"),
           "rewards in [0, 1]"),
    requires=("prompt_value_logits",),
    params=("sppo_value_model", "sppo_value_lr", "sppo_value_mini_batch_size"),
    validate=_validate,
)
def sppo_advantages(rewards: torch.Tensor, group_size: int, *, prompt_value_logits: torch.Tensor) -> torch.Tensor:
    """SPPO advantage `A_i = R_i − σ(V(x_i))` `(N,)`, one scalar per rollout (broadcast over its tokens).

    `rewards (N,)` in [0, 1] (NaN = unscored), `prompt_value_logits (N,)` the value model's logit `V(x_i)` of each
    rollout's prompt, computed before the value model's update on this batch (trainer requirement
    `prompt_value_logits`, `sppo_value.py`). No group statistic: `group_size` is only the layout, and `G = 1`
    (the official setting) gives a non-zero advantage.

    Official code: sustech-nlp/SPPO@55e8a7236dabbd7c421ab987eebeb1a067b4c436
    `verl/trainer/ppo/core_algos.py:compute_sequence_level_advantage` (l.757-774: `R = token_level_rewards.sum(-1)`,
    `adv = R − sigmoid(values)`, no normalisation, `returns = R` as the critic's target); the values are the
    critic's logit at the last prompt token (`verl/workers/critic/dp_critic.py:_forward_prompt_value`, l.54-84),
    computed before the critic's update (`verl/trainer/ppo/ray_trainer.py`, `fit`: values l.1156-1159, advantage
    l.1192, `update_critic` l.1203-1205, then the actor). The critic's BCE is in `sppo_value.py`.

    Choices: the paper's text beyond its abstract was not available to us; the formula is the official code's. The
    registry flags follow the official run scripts: one response per prompt (`num_generations=1`, allowed for this
    variant only, see `allow_one_rollout`), temperature 0.6, `loss_type="dapo"` (verl's token-mean loss with PPO clip
    0.2, TRL's `epsilon` default), value-model lr 5e-6; no KL (TRL's `beta=0` default). `G > 1` is accepted too (each
    rollout gets its own `R − σ(V(x))`, the prompt's value shared). Evaluation computes the advantages with the
    current value model and does not update it.

    Edge cases: NaN rewards (unscored) get advantage 0 (and are left out of the value model's BCE); rewards outside
    [0, 1], ±inf included, raise `ValueError` (the BCE target must be a probability); a non-finite logit raises.
    """
    check_unit_interval_rewards(rewards)
    logits = prompt_value_logits.to(device=rewards.device, dtype=torch.float32)
    if logits.shape != rewards.shape:
        raise ValueError(f"sppo: {logits.shape[0] if logits.dim() else 0} prompt values for {rewards.numel()} rewards.")
    if not torch.isfinite(logits).all():
        raise ValueError("sppo: the value model returned non-finite logits; lower sppo_value_lr.")
    advantages = rewards.float() - torch.sigmoid(logits)
    return torch.where(torch.isnan(rewards), torch.zeros_like(advantages), advantages)
