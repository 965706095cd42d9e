"""GRPOConfig: TRL's defaults untouched, and every bad input rejected at construction with the fix named."""

import dataclasses

import pytest
import trl

import trl_groupx
from trl_groupx import GRPOConfig

BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)


def test_trl_fields_and_defaults_unchanged():
    ours = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    for f in dataclasses.fields(trl.GRPOConfig):
        assert f.name in ours
        assert ours[f.name].default == f.default or (f.default is dataclasses.MISSING), f.name
    a, b = GRPOConfig(**BASE), trl.GRPOConfig(**BASE)
    for f in dataclasses.fields(trl.GRPOConfig):
        if f.name not in ("accelerator_config",):
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert a.active_variants() == {}


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(loss_type="gmpo2"), r"loss_type='gmpo2' is not a variant of the objective stage.*'gmpo'"),
        (dict(advantage_estimator="softmax"), r"advantage_estimator='softmax'.*Choose one of \['grpo', .*'sign_adv'"),
        (dict(advantage_estimator="gmpo"), r"'gmpo' belongs to the objective stage; switch it on with"),
        (dict(token_weighting="sign_adv"), r"'sign_adv' belongs to the advantages stage"),
        (dict(rollout_filter="no_such_filter"), r"rollout_filter='no_such_filter' is not a variant of the sampling"),
        (dict(gmpo_clip=0.3), r"gmpo_clip=0.3 belongs to variant 'gmpo'.*set loss_type='gmpo'"),
        (dict(gtpo_alpha2=0.5), r"gtpo_alpha2=0.5 belongs to variant 'gtpo_entropy'.*token_weighting"),
        (dict(loss_type="dapo", loss_aggregation="token_mean"), r"only applies to trl_groupx objectives"),
        (dict(loss_type="gmpo", loss_aggregation="median"), r"loss_aggregation='median' is unknown"),
        (dict(loss_type="gmpo", entropy_coef=0.01), r"entropy bonus.*entropy_coef=0"),
        (dict(loss_type="gmpo", importance_sampling_level="sequence"), r"leave importance_sampling_level='token'"),
        (dict(loss_type="gmpo", delta=2.0), r"delta .* unset it"),
        (dict(advantage_estimator="sign_adv", scale_rewards="none"), r"scale_rewards='none' would be ignored"),
        (dict(advantage_estimator="sign_adv", multi_objective_aggregation="normalize_then_sum"), r"GDPO"),
        (dict(token_weighting="gtpo_entropy", gtpo_level="segment"), r"gtpo_level must be 'token'"),
        (dict(token_weighting="gtpo_entropy", gtpo_normalization="rank"), r"gtpo_normalization must be"),
    ],
)
def test_bad_input_fails_at_construction(flags, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**BASE, **flags)


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(token_weighting="gtpo_entropy", advantage_estimator="sign_adv"), r"computes its own advantages.*sign_adv"),
        (
            dict(token_weighting="gtpo_entropy", multi_objective_aggregation="normalize_then_sum"),
            r"computes its own advantages.*normalize_then_sum",
        ),
    ],
)
def test_stage_replacing_variants_reject_what_they_discard(flags, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**BASE, **flags)


def test_compositions_across_stages_are_accepted():
    config = GRPOConfig(**BASE, advantage_estimator="sign_adv", loss_type="gmpo")
    assert config.active_variants() == {"advantages": "sign_adv", "objective": "gmpo"}
    config = GRPOConfig(**BASE, token_weighting="gtpo_entropy", loss_type="gmpo")
    assert config.active_variants() == {"token_weights": "gtpo_entropy", "objective": "gmpo"}
    # an estimator that reads scale_rewards (a weighting of GRPO's own advantage) accepts Dr. GRPO's setting
    assert GRPOConfig(**BASE, advantage_estimator="focal_tailmiss", scale_rewards="none").scale_rewards == "none"


@pytest.mark.parametrize("estimator", ["agentflow", "gigpo", "hgpo"])
def test_step_credit_estimators_refuse_a_token_stage(estimator):
    with pytest.raises(ValueError, match=f"advantage_estimator='{estimator}' writes per-turn .* unset token_weighting"):
        GRPOConfig(**BASE, advantage_estimator=estimator, token_weighting="nat")


# sppo's baseline is a learned prompt value, not a group: its official runs sample one response per prompt, so it is
# the one variant that accepts num_generations=1 (tests/unit/advantages/test_sppo.py).
ONE_ROLLOUT_VARIANTS = {"sppo"}


@pytest.mark.parametrize("variant", [v for v in trl_groupx.list_variants()
                                     if not v.native and v.id not in ONE_ROLLOUT_VARIANTS], ids=lambda v: v.id)
def test_group_size_one_is_refused_for_every_variant(variant, tmp_path):
    """A group of one has no baseline: TRL's config refuses it, and no variant's flags get past that check (but
    the learned-value variants of ONE_ROLLOUT_VARIANTS)."""
    flags = {k: v for k, v in variant.flags.items() if k != "num_generations"}
    with pytest.raises(ValueError, match="at least 2 generations per prompt"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=1, per_device_train_batch_size=8, **flags)
