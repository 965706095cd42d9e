"""Bad-input matrix over the whole registry: every dispatched variant meets unscored rollouts (None and NaN
rewards), all-equal groups, groups of two and fully truncated completions in a real training step, and every
variant's hyper-parameters are refused when the variant is off. Each case either trains with finite loss and
gradients (unscored rollouts getting advantage 0) or is refused at construction with a message naming a flag.
Generated from the registry, so a new variant joins without an edit here. (Rewards that are ±inf, non-numeric or
raise are refused for every configuration by the reward checks: tests/integration/test_reward_checks_training.py.)"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, one_step
from trl_groupx.config import GRPOConfig
from trl_groupx.toy import tiny_model_path
from trl_groupx.toy.counter_rollout import make_counter_game_rollout
from trl_groupx.toy.two_agent_rollout import make_two_agent_rollout
from trl_groupx.toy.two_module_program import make_two_module_program_rollout

CONFIG_FIELDS = {f.name for f in dataclasses.fields(GRPOConfig)}
VARIANTS = [v for v in trl_groupx.list_variants() if not v.native]


def _text(c):
    return c[-1]["content"] if isinstance(c, list) else c


def unscored_parity(completions, **kwargs):
    """0/1 by the parity of the last character; completions 1 and 3 of every 4 are unscored (None, NaN)."""
    out = []
    for i, c in enumerate(completions):
        t = _text(c)
        out.append(None if i % 4 == 1 else math.nan if i % 4 == 3 else float(ord(t[-1]) % 2) if t else 0.0)
    return out


def unscored_length(completions, **kwargs):
    return [None if i % 4 in (1, 3) else float(len(_text(c)) <= 3) for i, c in enumerate(completions)]


def constant(completions, **kwargs):
    return [1.0] * len(completions)


def constant_second(completions, **kwargs):
    return [0.0] * len(completions)


def parity(completions, **kwargs):
    return [float(ord(_text(c)[-1]) % 2) if _text(c) else 0.0 for c in completions]


def length(completions, **kwargs):
    return [float(len(_text(c)) <= 3) for c in completions]


def toy_flags(variant, **overrides) -> dict:
    """The variant's registry flags sized for the tiny model: ≥ 2 groups and ≥ 8 rollouts per step."""
    flags = {**variant.flags, **overrides}
    per_device = max(8, 2 * flags.get("num_generations", 4))
    flags["per_device_train_batch_size"] = per_device
    if "generation_batch_size" in flags:
        flags["generation_batch_size"] = per_device
    return flags


def build(variant, tmp_path, rewards, **overrides):
    needs_two = "rewards_per_func" in variant.requires
    reward_funcs = list(rewards) if needs_two else rewards[0]
    extra = {}
    if "step_modules" in variant.requires:  # LM calls grouped by module: the shipped two-module program
        extra["rollout_func"] = make_two_module_program_rollout()
        overrides.setdefault("max_completion_length", 16)
    elif "step_structure" in variant.requires:  # multi-turn step credit: the shipped counter game with a step record
        extra["rollout_func"] = make_counter_game_rollout()
        overrides.setdefault("max_completion_length", 64)
    if "counterfactual_rewards" in variant.requires:  # CCPO: the shipped Thinker → Solver team and its Solver-only run
        extra["rollout_func"] = make_two_agent_rollout()
    if "gcpo_ref_column" in variant.params:  # the toy dataset's reference column
        overrides.setdefault("gcpo_ref_column", "answer")
    if variant.flags.get("edge_grpo_gec"):  # EDGE-GRPO's guided correction: the toy's one reference column for both
        overrides.setdefault("edge_grpo_gec_answer_column", "answer")
        overrides.setdefault("edge_grpo_gec_solution_column", "answer")
    if "sage_column" in variant.params:  # SAGE: the toy dataset's reference column
        overrides.setdefault("sage_column", "answer")
    if "lspo_column" in variant.params:  # LSPO: the toy dataset's reference column (the scaffold's SFT target)
        overrides.setdefault("lspo_column", "answer")
    if "belief_probe_answer_column" in variant.params:  # GRPO-VPS: the toy dataset's reference answers
        overrides.setdefault("belief_probe_answer_column", "answer")
    if "teacher_logps" in variant.requires:  # dGRPO's teacher: the tiny model itself (the student's tokenizer)
        overrides.setdefault("opd_teacher_model", tiny_model_path())
    if "dpo_logps" in variant.requires:  # RTO's DPO model: the tiny model itself (the policy's tokenizer)
        overrides.setdefault("rto_dpo_model", tiny_model_path())
    if "prompt_value_logits" in variant.requires:  # SPPO's value model: the tiny model with a new scalar head
        overrides.setdefault("sppo_value_model", tiny_model_path())
    if "s2l_po_explorer_model" in variant.params:  # S2L-PO's explorer: the tiny model itself (same tokenizer)
        overrides.setdefault("s2l_po_explorer_model", tiny_model_path())
    if "rc_grpo_prompt_condition_tokens" in variant.params:  # RC-GRPO: the tiny model given its reward tokens
        from trl_groupx.sampling.rctp import save_with_condition_tokens
        from trl_groupx.toy import load_tiny_tokenizer

        extra["processing_class"] = load_tiny_tokenizer()
        extra["model"] = save_with_condition_tokens(tiny_model_path(), extra["processing_class"], tmp_path / "model")
    if "consistency_grpo_column" in variant.params:  # paraphrase groups: the toy problems' phrasings, at most G
        from trl_groupx.toy import arithmetic_dataset
        from trl_groupx.toy.paraphrases import add_arithmetic_paraphrases

        size = overrides.get("num_generations", variant.flags.get("num_generations", 4))
        extra["dataset"] = add_arithmetic_paraphrases(arithmetic_dataset(64, seed=0)).map(
            lambda row: {"paraphrases": row["paraphrases"][:size]})
    peft = bool({"ref_logps", "reference_sample_rewards"} & set(variant.requires))  # the base is the reference
    return build_trainer(trl_groupx.GRPOTrainer, GRPOConfig, tmp_path, peft=peft, reward_funcs=reward_funcs, **extra,
                         **toy_flags(variant, **overrides))


def assert_trains(trainer):
    loss, grads, _ = one_step(trainer)
    assert torch.isfinite(loss), loss
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    return loss


def assert_refused_naming_a_flag(err: ValueError, variant):
    message = str(err)
    assert variant.id in message or any(name in message for name in CONFIG_FIELDS), message


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_unscored_rollouts_get_zero_advantage(variant, tmp_path):
    trainer = build(variant, tmp_path, (unscored_parity, unscored_length))
    assert_trains(trainer)
    unscored = torch.isnan(trainer._rewards_per_func).all(dim=1)
    assert unscored.any()
    logged = torch.tensor(list(trainer._logs["advantages"])[-len(unscored):])
    assert (logged[unscored] == 0).all(), logged


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_all_equal_groups(variant, tmp_path):
    if variant.id == "sgpo":  # every profiled prompt solved every time: nothing left to train on, a clear refusal
        with pytest.raises(ValueError, match="no prompt to train on.*raise sgpo_unsolvable_keep"):
            one_step(build(variant, tmp_path, (constant, constant_second)))
        return
    assert_trains(build(variant, tmp_path, (constant, constant_second)))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_groups_of_two(variant, tmp_path):
    try:
        trainer = build(variant, tmp_path, (parity, length), num_generations=2)
    except ValueError as err:  # e.g. a filter that keeps more rollouts than a group has
        assert_refused_naming_a_flag(err, variant)
        return
    assert_trains(trainer)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_every_completion_truncated_and_masked(variant, tmp_path):
    try:
        trainer = build(variant, tmp_path, (parity, length), max_completion_length=1, mask_truncated_completions=True)
    except ValueError as err:
        assert_refused_naming_a_flag(err, variant)
        return
    assert_trains(trainer)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.params], ids=lambda v: v.id)
def test_hyper_parameter_of_a_variant_that_is_off(variant):
    name = variant.params[0]
    default = next(f for f in dataclasses.fields(GRPOConfig) if f.name == name)
    value = default.default_factory() if default.default is dataclasses.MISSING else default.default
    changed = (not value) if isinstance(value, bool) else (value + 1 if isinstance(value, (int, float)) else "x")
    with pytest.raises(ValueError, match=f"{name}=.*belongs to variant '{variant.id}'.*set {variant.selector}="):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **{name: changed})
