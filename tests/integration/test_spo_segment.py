"""SPO-chain on the tiny model: the trainer continues every cut point's prefix K times through TRL's generator (spied
on `_generate_single_turn`), the values it hands the variant are the mean run rewards of those continuations, calls
have equal size; the gradient differs from plain GRPO (full and LoRA); composition with the Balanced Aggregation
objective; a rollout_func is refused at construction."""

import collections
import dataclasses
import functools
import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from tests.integration.objective_helpers import ours
from trl_groupx.token_weights.spo_segment import cut_points

K = 2
# every low-probability token is a cut point: the 6-token toy completions get several cuts each
FLAGS = dict(token_weighting="spo_segment", spo_segment_num_rollouts=K, spo_segment_cut_interval=1)


def spy(trainer):
    """Record the token variant's context, and every extra generate call (queries, budget, raw continuations)."""
    seen = {"calls": []}
    variant = trainer.variants["token_weights"]

    @functools.wraps(variant.fn)  # the trainer reads the variant's config fields from the signature
    def fn(advantages, ctx, **kwargs):
        out = variant.fn(advantages, ctx, **kwargs)
        seen.update(ctx=ctx, out=out)
        return out

    trainer.variants["token_weights"] = dataclasses.replace(variant, fn=fn)
    real = trainer._generate_single_turn

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        result = real(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if trainer._generating_baseline:
            seen["calls"].append(([list(p) for p in prompt_ids], trainer.generation_config.max_new_tokens,
                                  [list(c) for c in result[0]]))
        return result

    trainer._generate_single_turn = generate
    real_stages = trainer.apply_rollout_stages

    def apply_rollout_stages(output):  # the generation batch in row order (TRL shuffles it afterwards)
        seen["output"] = {k: v for k, v in output.items() if k in ("prompt_ids", "prompt_mask", "completion_ids")}
        return real_stages(output)

    trainer.apply_rollout_stages = apply_rollout_stages
    return seen


def test_continuations_come_from_the_cut_prefixes_and_values_are_their_mean_reward(tmp_path):
    trainer = ours(tmp_path, **FLAGS)
    seen = spy(trainer)
    one_step(trainer)
    ctx, tok, inputs = seen["ctx"], trainer.processing_class, seen["output"]
    length = trainer.max_completion_length
    b = ctx.completion_mask.size(0)
    prompts = [inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist() for i in range(b)]
    continuations = collections.defaultdict(list)  # query -> its continuations, as generated
    fillers = 0
    for queries, budget, outs in seen["calls"]:
        assert len(queries) == b  # equal-size calls: the process's rows of the generation batch
        prefix_lengths = []
        for q, c in zip(queries, outs):
            if q in prompts:  # filler: a bare prompt (every real query holds at least one completion token)
                fillers += 1
                continue
            continuations[tuple(q)].append(c)
            prompt = max((p for p in prompts if q[: len(p)] == p), key=len)
            prefix_lengths.append(len(q) - len(prompt))
        # max_new_tokens of a call: the largest budget max_completion_length − j among its queries
        assert budget == max(length - j for j in prefix_lengths)
    expected_queries = set()
    checked = 0
    for i in range(b):
        n = int(ctx.completion_mask[i].sum())
        ids = inputs["completion_ids"][i, :n].tolist()
        cuts = cut_points(ctx.logps[i], n, 0.9, 1)
        assert cuts == [j for j in range(1, n) if ctx.logps[i, j].exp() < 0.9]  # interval 1: every low token but 0
        values = ctx.segment_mc_values[i]
        for j in range(ctx.completion_mask.size(1)):
            if j not in cuts:
                assert math.isnan(values[j])  # no cut, padding: NaN
                continue
            query = tuple(prompts[i] + ids[:j])
            expected_queries.add(query)
            conts = continuations[query]
            assert len(conts) == K  # K continuations of this prefix (once per group when rows share it)
            texts = tok.batch_decode([ids[:j] + c[: length - j] for c in conts], skip_special_tokens=True)
            rewards = parity_reward(texts)
            assert values[j].item() == pytest.approx(sum(rewards) / K)
            checked += 1
    assert set(continuations) == expected_queries  # nothing else was generated
    assert checked >= b  # several cut points per completion
    total = sum(len(c) for c in continuations.values()) + fillers
    assert total == len(seen["calls"]) * b and fillers < b


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_grpo(tmp_path, peft):
    _, grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft))
    trainer = ours(tmp_path / "spo", peft, **FLAGS)
    seen = spy(trainer)
    _, spo, inputs = one_step(trainer)
    # the same rollouts (the extra generations move the RNG, so TRL shuffles them into another order)
    assert sorted(inputs["completion_ids"].tolist()) == sorted(inputs_grpo["completion_ids"].tolist())
    assert inputs["advantages"].shape == inputs["completion_ids"].shape
    # only low-probability tokens carry an advantage
    ctx, out = seen["ctx"], seen["out"]
    assert (out[(ctx.logps.exp() >= 0.9) | (ctx.completion_mask == 0)] == 0).all()
    assert out.abs().sum() > 0
    assert grads_differ(grpo, spo)


def test_composes_with_the_balanced_aggregation_objective(tmp_path):
    # Balanced Aggregation reads the sign of each sequence's mean token advantage; the SPO token advantages flow in
    _, plain, _ = one_step(ours(tmp_path / "plain", **FLAGS))
    flags = dict(loss_type="balanced_agg", loss_aggregation="balanced", balanced_agg_scope="group")
    loss, grads, inputs = one_step(ours(tmp_path / "balanced", **flags, **FLAGS))
    assert torch.isfinite(loss) and inputs["advantages"].dim() == 2 and "groupx_sequence_scale" in inputs
    assert any(g.abs().sum() > 0 for g in grads.values())
    assert grads_differ(plain, grads)


def test_rollout_func_is_refused_at_construction(tmp_path):
    def rollout_func(prompts, trainer):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="spo_segment.*rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, rollout_func=rollout_func, **FLAGS)
