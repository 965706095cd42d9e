"""`GRPOConfig`: TRL's config plus one selector field per stage and the variants' own hyper-parameters.

With every new field at its default, the config is TRL's and training is TRL's, number for number. Bad values
and contradictory combinations raise `ValueError` here, at construction, naming the flag and the fix.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass

import trl

from .advantages.config import AdvantageArgs
from .advantages.sppo import allow_one_rollout
from .memory.chunked_logps import ChunkedLogpsArgs
from .memory.prefix_grouper import PrefixGrouperArgs
from .objective import AGGREGATIONS, KL_ESTIMATORS, TRL_LOSS_AGGREGATION, TRL_REFERENCE_SURROGATE, resolved_aggregation
from .objective.config import ObjectiveArgs
from .objective.turn_ratio import TURN_LEVEL, check_turn_level
from .registry import SELECTORS, dispatchable_ids, get_variant, list_variants
from .sampling.config import SamplingArgs
from .token_weights.config import TokenWeightArgs

TRL_LOSS_TYPES: tuple[str, ...] = tuple(TRL_LOSS_AGGREGATION)


@dataclass
class GRPOConfig(
    SamplingArgs, AdvantageArgs, TokenWeightArgs, ObjectiveArgs, ChunkedLogpsArgs, PrefixGrouperArgs, trl.GRPOConfig
):
    r"""Configuration for `trl_groupx.GRPOTrainer`: every argument of
    [`trl.GRPOConfig`](https://huggingface.co/docs/trl/grpo_trainer), plus one selector per stage and the variants'
    hyper-parameters, defined (and documented) with their stage:

    - `trl_groupx.sampling.config.SamplingArgs`: `rollout_filter`.
    - `trl_groupx.advantages.config.AdvantageArgs`: `advantage_estimator`.
    - `trl_groupx.token_weights.config.TokenWeightArgs`: `token_weighting`, `gtpo_*`.
    - `trl_groupx.objective.config.ObjectiveArgs`: `loss_aggregation`, `gmpo_clip`; the selector is TRL's
      `loss_type`, extended with this package's objectives.
    - `trl_groupx.memory.chunked_logps.ChunkedLogpsArgs`: `logps_chunk_size` (chunked log-probs; not a variant).
    - `trl_groupx.memory.prefix_grouper.PrefixGrouperArgs`: `prefix_grouper` (shared-prefix forward; not a variant).

    Set a stage's selector to a variant id (`trl-groupx list`). Each hyper-parameter belongs to one variant;
    setting it while that variant is off is an error.
    """

    def __post_init__(self) -> None:
        with allow_one_rollout(self):  # sppo's one rollout per prompt passes TRL's num_generations >= 2 check
            super().__post_init__()
        validate_config(self)

    def active_variants(self) -> dict[str, str]:
        """Stage → id of the dispatched variant, for the stages that have one."""
        selected = {stage: getattr(self, selector) for stage, selector in SELECTORS.items()}
        return {stage: vid for stage, vid in selected.items() if vid in dispatchable_ids(stage)}


def validate_config(config: GRPOConfig) -> None:
    """Raise `ValueError` for unknown variant ids, orphan hyper-parameters and incompatible combinations."""
    _check_selectors(config)
    active_by_stage = config.active_variants()
    active = set(active_by_stage.values())
    _check_orphan_params(config, active)
    for vid in active:
        variant = get_variant(vid)
        if variant.validate is not None:
            variant.validate(config)
        for stage in variant.replaces:
            other = active_by_stage.get(stage)
            if stage == "advantages" and config.multi_objective_aggregation != "sum_then_normalize":
                other = other or "multi_objective_aggregation='normalize_then_sum'"
            if other:
                raise ValueError(
                    f"{variant.selector}={vid!r} computes its own {stage} from the rewards, so the {stage} stage's "
                    f"setting ({other}) would be ignored; drop one of the two."
                )

    custom_objective = config.loss_type not in TRL_LOSS_TYPES
    check_turn_level(config)  # importance_sampling_level="turn": trl_groupx objectives that take the level only
    if config.loss_aggregation is not None:
        if not custom_objective:
            raise ValueError(
                f"loss_aggregation={config.loss_aggregation!r} only applies to trl_groupx objectives; TRL's "
                f"loss_type={config.loss_type!r} fixes its own normaliser "
                f"({TRL_LOSS_AGGREGATION[config.loss_type]!r}). Unset loss_aggregation or pick another loss_type."
            )
        if config.loss_aggregation not in AGGREGATIONS:
            raise ValueError(f"loss_aggregation={config.loss_aggregation!r} is unknown; use one of {AGGREGATIONS}.")
    if custom_objective:
        if config.entropy_coef != 0.0 or config.use_adaptive_entropy:
            raise ValueError(
                f"loss_type={config.loss_type!r} does not support TRL's entropy bonus yet; set entropy_coef=0 and "
                "use_adaptive_entropy=False, or use one of TRL's loss types."
            )
        if config.importance_sampling_level not in ("token", TURN_LEVEL):
            raise ValueError(
                f"loss_type={config.loss_type!r} defines its own importance ratio; leave "
                "importance_sampling_level='token'."
            )
        if config.delta is not None:
            raise ValueError(f"delta (two-sided clipping) does not apply to loss_type={config.loss_type!r}; unset it.")

    _check_kl_estimator(config, custom_objective)
    estimator = active_by_stage.get("advantages")
    if estimator and "step_structure" in get_variant(estimator).requires and config.token_weighting is not None:
        raise ValueError(f"advantage_estimator={estimator!r} writes per-turn (B, T) advantages, so "
                         f"token_weighting={config.token_weighting!r} cannot follow it; unset token_weighting.")
    if config.balanced_agg_scope not in ("group", "batch"):
        raise ValueError(f"balanced_agg_scope={config.balanced_agg_scope!r} is unknown; use 'group' or 'batch'.")
    if config.balanced_agg_scope != "group" and (not custom_objective or resolved_aggregation(config) != "balanced"):
        raise ValueError(
            f"balanced_agg_scope={config.balanced_agg_scope!r} only applies with loss_aggregation='balanced' "
            "(loss_type='balanced_agg' or another trl_groupx objective); drop it or switch balanced aggregation on."
        )

    if config.advantage_estimator != "grpo":
        if config.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"advantage_estimator={config.advantage_estimator!r} replaces TRL's advantage computation, so "
                "multi_objective_aggregation='normalize_then_sum' (GDPO) would be ignored; use one or the other."
            )
        estimator = get_variant(config.advantage_estimator)
        reads_scale = "scale_rewards" in inspect.signature(estimator.fn).parameters
        if config.scale_rewards != "group" and not reads_scale:
            raise ValueError(
                f"advantage_estimator={config.advantage_estimator!r} replaces TRL's advantage computation, so "
                f"scale_rewards={config.scale_rewards!r} would be ignored; leave scale_rewards at its default."
            )


def _check_kl_estimator(config: GRPOConfig, custom_objective: bool) -> None:
    """`kl_estimator` and `beta_negative` change TRL's KL term, so with a TRL loss type they move the loss to
    trl_groupx's reference of it (`TRL_REFERENCE_SURROGATE`)."""
    if config.kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={config.kl_estimator!r} is unknown; use one of {KL_ESTIMATORS}.")
    changed = []
    if config.kl_estimator != "k3":
        changed.append((f"kl_estimator={config.kl_estimator!r}", "leave kl_estimator='k3'"))
    if config.beta_negative is not None:
        b = config.beta_negative
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 0:
            raise ValueError(f"beta_negative must be a finite number >= 0 (MDP-GRPO: 0.025) or None, got {b!r}.")
        changed.append((f"beta_negative={b!r}", "unset beta_negative"))
    for flag, undo in changed:
        if config.beta == 0.0:
            raise ValueError(f"{flag} has no effect with beta=0 (no KL penalty); set beta > 0 or {undo}.")
        if custom_objective:
            continue
        if config.loss_type not in TRL_REFERENCE_SURROGATE:
            raise ValueError(
                f"{flag} cannot be combined with loss_type={config.loss_type!r}: trl_groupx has no reference of that "
                f"loss to change its KL term in. Use one of {sorted(TRL_REFERENCE_SURROGATE)} or {undo}."
            )
        if config.entropy_coef != 0.0 or config.use_adaptive_entropy:
            raise ValueError(
                f"{flag} moves the loss to trl_groupx's objective path, which does not support TRL's entropy bonus "
                f"yet; set entropy_coef=0 and use_adaptive_entropy=False, or {undo}."
            )


def _check_selectors(config: GRPOConfig) -> None:
    for stage, selector in SELECTORS.items():
        value = getattr(config, selector)
        allowed = dispatchable_ids(stage)
        builtin = {"objective": list(TRL_LOSS_TYPES), "advantages": ["grpo"]}.get(stage, [None])
        if value in builtin or value in allowed:
            continue
        hint = ""
        try:
            variant = get_variant(value)
            hint = f" {value!r} belongs to the {variant.stage} stage; switch it on with {dict(variant.flags)}."
        except (KeyError, TypeError):
            pass
        raise ValueError(
            f"{selector}={value!r} is not a variant of the {stage} stage.{hint} Choose one of "
            f"{[v for v in builtin if v is not None] + allowed}" + (" or None." if None in builtin else ".")
        )


def _check_orphan_params(config: GRPOConfig, active: set[str]) -> None:
    defaults = {
        f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        for f in dataclasses.fields(GRPOConfig)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    for variant in list_variants():
        if variant.id in active:
            continue
        for name in variant.params:
            if getattr(config, name) != defaults[name]:
                raise ValueError(
                    f"{name}={getattr(config, name)!r} belongs to variant {variant.id!r}, which is not switched on; "
                    f"set {variant.selector}={variant.id!r} or drop {name}."
                )
