"""Construction-time checks of what a `GRPOTrainer` was given: the model for the efficiency flags, and the components
the active variants need (reward functions, a reference model, a step record). Each raises `ValueError` naming the
flag and the fix, so a run fails before its first generation rather than deep inside a step."""

from __future__ import annotations

from typing import Any

from accelerate.utils import is_peft_model

from .registry import Variant


def check_model_for_flags(trainer: Any) -> None:
    """`logps_chunk_size` and `prefix_grouper` support only some models: refuse the others now, not mid-run."""
    inner = trainer.accelerator.unwrap_model(trainer.model)
    inner = inner.get_base_model() if is_peft_model(inner) else inner
    if getattr(trainer.args, "logps_chunk_size", None) is not None:
        from .memory.chunked_logps import check_supported as check_chunked

        check_chunked(inner, compute_aux_loss=trainer.aux_loss_enabled)
    if getattr(trainer.args, "prefix_grouper", False):
        from .memory.prefix_grouper import check_supported as check_prefix

        check_prefix(inner, compute_aux_loss=trainer.aux_loss_enabled)


def check_variant_components(trainer: Any, variants: dict[str, Variant]) -> None:
    """What the active variants read must exist: the reward functions their `*_reward_index` fields name, a
    reference model for token variants that need reference log-probs, a step record for step-credit estimators."""
    for variant in variants.values():  # variants that read named columns of the reward matrix
        for name in (p for p in variant.params if p.endswith("_reward_index")):
            if not 0 <= getattr(trainer.args, name) < len(trainer.reward_funcs):
                raise ValueError(
                    f"{variant.selector}={variant.id!r} reads reward_funcs[{name}] with {name}="
                    f"{getattr(trainer.args, name)}, but the trainer was given {len(trainer.reward_funcs)} reward "
                    f"function(s): pass the missing one (see the variant's docstring) or change {name}."
                )
    if getattr(variants.get("sampling"), "id", None) == "gcpo_ref":  # reference column, single-turn generation
        from .sampling.reference_injection import check_reference_injection

        check_reference_injection(trainer)
    if getattr(variants.get("sampling"), "id", None) == "soup":  # single-turn generation
        from .sampling.soup_glue import check_soup

        check_soup(trainer)
    if getattr(variants.get("sampling"), "id", None) == "lspo":  # solution column, single-turn generation
        from .sampling.lspo_scaffold import check_lspo

        check_lspo(trainer)
    if getattr(variants.get("sampling"), "id", None) == "igrpo":  # single-turn generation from rewritten prompts
        from .sampling.best_draft import check_best_draft

        check_best_draft(trainer)
    if getattr(variants.get("sampling"), "id", None) == "rc_grpo":  # the policy must know the reward tokens
        from .sampling.reward_tokens import check_reward_tokens

        check_reward_tokens(trainer)
    if getattr(variants.get("sampling"), "id", None) == "consistency_grpo":  # the dataset's paraphrase column
        from .sampling.paraphrase_groups import check_paraphrase_column

        check_paraphrase_column(trainer)
    if getattr(variants.get("sampling"), "id", None) == "sage":  # reference column, single-turn generation
        from .sampling.self_hints import check_self_hints

        check_self_hints(trainer)
    if getattr(variants.get("sampling"), "id", None) == "n_grpo":  # mixed inputs: TRL's single-turn generation
        from .sampling.neighbor_mixing import check_generation_path

        check_generation_path(trainer)
    if getattr(variants.get("sampling"), "id", None) == "logit_avg":  # the frozen reference the policy is mixed with
        from .sampling.logit_averaging import prepare_reference

        prepare_reference(trainer)
    if getattr(trainer.args, "edge_grpo_gec", False):  # EDGE-GRPO GEC: both reference columns, single-turn generation
        from .sampling.edge_grpo_gec import check_gec

        check_gec(trainer)
    token_variant = variants.get("token_weights")
    if getattr(token_variant, "id", None) == "belief_probe":  # the reference answers, text prompts
        from .token_weights.belief_probe_forward import check_belief_probe

        check_belief_probe(trainer)
    if getattr(token_variant, "id", None) == "spo_segment":  # continuations from TRL's single-turn generator
        from .token_weights.spo_segment_rollouts import check_spo_segment

        check_spo_segment(trainer)
    if token_variant and "token_blocks" in token_variant.requires:  # one text block per reward function
        from .token_weights.blocks import block_tags_field

        flag = block_tags_field(token_variant.params)
        tags = getattr(trainer.args, flag)
        if len(tags) != len(trainer.reward_funcs):
            raise ValueError(
                f"token_weighting={token_variant.id!r} gives block k's tokens the advantage of reward_funcs[k], but "
                f"{flag}={list(tags)!r} names {len(tags)} block(s) for {len(trainer.reward_funcs)} reward "
                f"function(s): pass one tag per reward function, in the order of reward_funcs."
            )
    if token_variant and "ref_logps" in token_variant.requires and trainer.beta == 0.0:
        if not is_peft_model(trainer.model):
            raise ValueError(
                f"token_weighting={token_variant.id!r} needs reference log-probs, and with beta=0 and full "
                "fine-tuning there is no reference model: train a LoRA adapter (the base model is the reference) "
                "or set beta > 0 (TRL then loads one, and also adds its loss-side KL)."
            )
    adv_variant = variants.get("advantages")
    needs_modules = adv_variant is not None and "step_modules" in adv_variant.requires
    if needs_modules and getattr(trainer, "rollout_func", None) is None:
        raise ValueError(
            f"advantage_estimator={adv_variant.id!r} groups the LM calls of a program by module: pass a rollout_func "
            "that returns `step_modules` (the module name of each LM call) per episode; environments give no "
            "module labels (see trl_groupx/toy/two_module_program.py)."
        )
    needs_steps = adv_variant is not None and "step_structure" in adv_variant.requires
    if needs_steps and getattr(trainer, "rollout_func", None) is None and not getattr(trainer, "environments", None):
        raise ValueError(
            f"advantage_estimator={adv_variant.id!r} assigns credit to the turns of multi-turn episodes: pass a "
            "rollout_func that returns `step_states` (and `step_rewards`) per episode, or an environment_factory "
            "whose environments have a `_step_structure()` method (see trl_groupx/toy/counter_rollout.py)."
        )
