"""The one registry of GRPO variants.

Every variant is a pure function registered under its catalog id, together with the metadata needed to list it,
validate a config against it and cite it. The registry is the only list of names in the package: the config
validates against it, the trainer dispatches through it, the CLI prints it. Nothing else names a variant.

A variant is *dispatched* through a stage selector: the config field that picks the variant of a stage
(`advantage_estimator`, `token_weighting`, `loss_type`, `rollout_filter`) set to the variant's id. Variants that
TRL already implements are registered with `native=True`: their `flags` are the TRL arguments that reproduce the
paper, and their `fn` is our pure reference implementation of the same formula (tested against TRL's numbers).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Stage = Literal["sampling", "advantages", "token_weights", "objective"]
STAGES: tuple[Stage, ...] = ("sampling", "advantages", "token_weights", "objective")

# The config field that selects the active variant of each stage. `loss_type` is TRL's own field, extended.
SELECTORS: dict[Stage, str] = {
    "sampling": "rollout_filter",
    "advantages": "advantage_estimator",
    "token_weights": "token_weighting",
    "objective": "loss_type",
}

# Inputs the trainer can compute for a variant when it declares it needs them. `completion_lengths` ((N,), advantage
# variants) and `global_step` (which brings `total_steps` too; schedules, any stage) arrive as keyword arguments of
# the variant's function; the others fill the stage's context. `step_structure` (advantage variants for multi-turn
# episodes) brings `steps: StepBatch` and makes the function return per-step advantages `(S,)`, which the trainer
# lays out on the episode's turns as `(N, T)` token advantages; `step_modules` (with it) also fills `StepBatch.module`,
# the module of each step's LM call, from a rollout_func's `step_modules` field (mmgrpo). `token_blocks` (token
# variants) fills
# `TokenContext.token_blocks` from the tags in the variant's `*_block_tags` field; `rewards_per_func` also fills
# `TokenContext.rewards_per_func` for token variants. `contrast_logps` (token variants) fills
# `TokenContext.contrast_logps`: the completions' log-probs under a negative version of each prompt (gcpo_guidance).
# `prompt_kl` (advantage variants): each row's prompt's policy drift since its last visit (`advantages/prompt_kl.py`).
# `intra_group_token_divergence` (token variants) fills `TokenContext.intra_group_token_divergence`: TW-GRPO's
# per-position disagreement of each group's full next-token distributions (no-grad forward, one group at a time).
# `tempered_logps` (token variants) fills `TokenContext.tempered_logps`: the sampled tokens' rollout log-probs at the
# temperatures of the variant's `*_temperatures` field (and `logps`/`entropies` from the same forward; DCPO).
# `teacher_logps` (objectives) fills `ObjectiveContext.teacher_logps`: the sampled tokens' log-probs under the frozen
# teacher the trainer loads from `opd_teacher_model` (dgrpo).
# `counterfactual_rewards` (advantage variants): each episode's run without the credited agent, from a rollout_func's
# `counterfactual_completion_ids` field, scored by the run's reward functions (ccpo).
# `nll_anchor_weights` (objectives) fills `ObjectiveContext.anchor_weights`: per-rollout weights of an NLL term on
# the correct rollouts, from the global generation batch (lightningrl).
# `dpo_logps` (token variants) fills `TokenContext.dpo_logps`: the sampled tokens' log-probs under the frozen
# DPO-trained model the trainer loads from `rto_dpo_model` (rto).
# `prompt_value_logits` (advantage variants): each row's prompt value logit V(x) from the value model the trainer
# loads from `sppo_value_model` and trains with BCE on the rewards once per generation batch (sppo).
# `judge_scores` (advantage variants): a user judge's scores of the responses of all-negative groups, NaN elsewhere
# (allneg_aifeedback).
# `prm_step_scores` (token variants) fills `TokenContext.prm_step_ids` / `prm_step_scores`: each token's reasoning
# step and a step PRM's scores, for the groups whose rewards are all equal only (verigate_step).
# `answer_belief` (token variants) fills `TokenContext.belief_segment_ids` and `answer_belief_logps`: each completion's
# segments and the policy's teacher-forced log-prob of the reference answer appended at each boundary (belief_probe).
# `segment_mc_values` (token variants) fills `TokenContext.segment_mc_values`: at each low-probability cut point of a
# completion, the mean reward of K continuations of prompt + prefix from TRL's generator (spo_segment).
# `self_teacher_topk` (objectives) fills `ObjectiveContext.self_distill`: the rows routed to self-distillation, the
# self-teacher's top-k distribution on them (once per generation batch) and the student's log-probs of the same
# tokens (per micro-batch, with grad) (srpo, `objective/self_teacher.py`).
KNOWN_REQUIREMENTS = frozenset(
    {"entropies", "old_logps", "ref_logps", "rewards_per_func", "group_structure", "completion_lengths", "global_step",
     "step_structure", "sum_pi_squared", "prompt_keys", "greedy_baseline_rewards", "reference_sample_rewards",
     "token_blocks", "contrast_logps", "prompt_kl", "step_modules",
     "answer_belief", "segment_mc_values",
     "intra_group_token_divergence", "tempered_logps", "teacher_logps", "counterfactual_rewards",
     "nll_anchor_weights", "dpo_logps", "prompt_value_logits", "judge_scores", "prm_step_scores", "self_teacher_topk",
     "pair_similarity"}
)

_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Variant:
    """One registered variant.

    Attributes:
        id (`str`): catalog id (`../shared/catalog.md`), lowercase snake case; also the selector value.
        name (`str`): human name, e.g. `"GMPO (Geometric-Mean Policy Optimization)"`.
        paper (`str`): title and arXiv id or URL.
        official_code (`str` or `None`): `repo@commit:path` of the official implementation, or `None`.
        stage (`Stage`): the pipeline stage the variant changes.
        flags (`Mapping[str, Any]`): `GRPOConfig` keyword arguments that switch the variant on with the paper's
            defaults.
        fn (`Callable`): the pure core function (contracts in `trl_groupx/contracts.py`).
        needs (`tuple[str, ...]`): components the user must supply (dataset columns, callables); empty for most.
        requires (`tuple[str, ...]`): inputs the trainer must compute for it (subset of `KNOWN_REQUIREMENTS`).
        params (`tuple[str, ...]`): config fields owned by this variant; setting one while the variant is off is an
            error.
        native (`bool`): TRL implements it; the trainer leaves the computation to TRL.
        stateful (`bool`): `fn` takes a keyword-only `state` dict that it reads and updates in place (running
            baselines, priors, buffers); the trainer keeps one per variant, identical on every process, and saves
            it with each checkpoint.
        validate (`Callable` or `None`): `validate(config)` raises `ValueError` for bad values of the variant's own
            hyper-parameters; called at config construction when the variant is on.
        replaces (`tuple[Stage, ...]`): earlier stages whose output this variant discards (e.g. a token-weight
            variant that recomputes advantages from the rewards); selecting a variant there too is an error.
        bibtex (`str` or `None`): BibTeX entry for model cards.
    """

    id: str
    name: str
    paper: str
    official_code: str | None
    stage: Stage
    flags: Mapping[str, Any]
    fn: Callable[..., Any]
    needs: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    native: bool = False
    stateful: bool = False
    replaces: tuple[Stage, ...] = ()
    validate: Callable[[Any], None] | None = None
    bibtex: str | None = None

    @property
    def selector(self) -> str:
        return SELECTORS[self.stage]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "paper": self.paper,
            "official_code": self.official_code,
            "stage": self.stage,
            "flags": dict(self.flags),
            "fn": self.fn,
            "needs": self.needs,
            "requires": self.requires,
            "params": self.params,
            "native": self.native,
            "stateful": self.stateful,
            "replaces": self.replaces,
        }


@dataclass
class _Registry:
    variants: dict[str, Variant] = field(default_factory=dict)

    def add(self, variant: Variant) -> Variant:
        if not _ID_PATTERN.match(variant.id):
            raise ValueError(f"Variant id {variant.id!r} must be lowercase snake case.")
        if variant.id in self.variants:
            raise ValueError(f"Variant id {variant.id!r} is already registered; ids are unique across all stages.")
        if variant.stage not in STAGES:
            raise ValueError(f"Variant {variant.id!r}: unknown stage {variant.stage!r}; expected one of {STAGES}.")
        unknown = set(variant.requires) - KNOWN_REQUIREMENTS
        if unknown:
            raise ValueError(f"Variant {variant.id!r} requires unknown inputs {sorted(unknown)}.")
        has_state_arg = "state" in inspect.signature(variant.fn).parameters
        if variant.stateful != has_state_arg:
            raise ValueError(f"Variant {variant.id!r}: stateful={variant.stateful} but its fn "
                             f"{'lacks' if variant.stateful else 'has'} a `state` argument.")
        if not variant.native and variant.flags.get(variant.selector) != variant.id:
            raise ValueError(
                f"Variant {variant.id!r}: its flags must set {variant.selector}={variant.id!r} so that it can be "
                "dispatched."
            )
        self.variants[variant.id] = variant
        return variant


_REGISTRY = _Registry()


def register(
    id: str,
    *,
    name: str,
    paper: str,
    official_code: str | None,
    stage: Stage,
    flags: Mapping[str, Any] | None = None,
    needs: tuple[str, ...] = (),
    requires: tuple[str, ...] = (),
    params: tuple[str, ...] = (),
    native: bool = False,
    stateful: bool = False,
    replaces: tuple[Stage, ...] = (),
    validate: Callable[[Any], None] | None = None,
    bibtex: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a pure function as the core of variant `id`.

    For a dispatched (non-native) variant `flags` defaults to `{selector: id}`.
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        resolved_flags = dict(flags) if flags is not None else {SELECTORS[stage]: id}
        _REGISTRY.add(
            Variant(
                id=id,
                name=name,
                paper=paper,
                official_code=official_code,
                stage=stage,
                flags=resolved_flags,
                fn=fn,
                needs=needs,
                requires=requires,
                params=params,
                native=native,
                stateful=stateful,
                replaces=replaces,
                validate=validate,
                bibtex=bibtex,
            )
        )
        return fn

    return decorator


def list_variants(stage: Stage | None = None) -> list[Variant]:
    """All registered variants (optionally of one stage), sorted by stage then id."""
    _ensure_loaded()
    selected = [v for v in _REGISTRY.variants.values() if stage is None or v.stage == stage]
    return sorted(selected, key=lambda v: (STAGES.index(v.stage), v.id))


def get_variant(variant_id: str) -> Variant:
    """The variant registered under `variant_id`; `KeyError` naming the known ids otherwise."""
    _ensure_loaded()
    try:
        return _REGISTRY.variants[variant_id]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY.variants))
        raise KeyError(f"No variant {variant_id!r}. Registered variants: {known}.") from None


def dispatchable_ids(stage: Stage) -> list[str]:
    """Ids that may be given to the stage's selector field."""
    return [v.id for v in list_variants(stage) if not v.native]


@contextlib.contextmanager
def scoped_variants() -> Iterator[None]:
    """Restore the registry on exit; lets tests register throw-away variants without leaking them."""
    _ensure_loaded()
    saved = dict(_REGISTRY.variants)
    try:
        yield
    finally:
        _REGISTRY.variants.clear()
        _REGISTRY.variants.update(saved)


def _ensure_loaded() -> None:
    # Stage modules register their variants on import; importing them here keeps `list_variants` complete
    # whichever module the caller imported first.
    from . import advantages, objective, sampling, token_weights  # noqa: F401
