"""The registry: strict registration, complete records, and one contract suite over every entry."""

import dataclasses
import re

import pytest
import torch

import trl_groupx
from trl_groupx.config import GRPOConfig
from trl_groupx.contracts import ObjectiveContext, TokenContext, config_kwargs
from trl_groupx.registry import KNOWN_REQUIREMENTS, SELECTORS, STAGES, register, scoped_variants

REQUIRED_IDS = {"grpo_deepseekmath", "gspo", "sapo", "gdpo_multireward", "dr_grpo", "dapo", "cispo", "sign_adv",
                "gtpo_entropy", "gmpo"}
CONFIG_FIELDS = {f.name for f in dataclasses.fields(GRPOConfig)}


def test_required_variants_are_registered():
    ids = {v.id for v in trl_groupx.list_variants()}
    assert REQUIRED_IDS <= ids


@pytest.mark.parametrize("variant", trl_groupx.list_variants(), ids=lambda v: v.id)
def test_record_is_complete(variant):
    record = variant.as_dict()
    for key in ("id", "name", "paper", "official_code", "stage", "flags", "fn", "needs"):
        assert key in record
    assert re.search(r"arXiv:\d{4}\.\d{4,5}|https?://", variant.paper), variant.paper
    assert variant.official_code is None or "/" in variant.official_code
    assert variant.stage in STAGES and callable(variant.fn)
    assert set(variant.requires) <= KNOWN_REQUIREMENTS
    assert set(variant.flags) <= CONFIG_FIELDS, set(variant.flags) - CONFIG_FIELDS
    assert set(variant.params) <= CONFIG_FIELDS
    assert variant.fn.__doc__ and len(variant.fn.__doc__) > 80  # formula and citation live there
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **variant.flags)  # its flags are valid


@pytest.mark.parametrize("variant", [v for v in trl_groupx.list_variants() if not v.native], ids=lambda v: v.id)
def test_dispatched_variant_contract(variant):
    """Shape, finiteness and padding behaviour of every dispatched variant on one generic batch."""
    config = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **variant.flags)
    kwargs = config_kwargs(variant.fn, config)
    if variant.stateful:
        kwargs["state"] = {}
    if "global_step" in variant.requires:
        kwargs.update(global_step=3, total_steps=10)
    torch.manual_seed(0)
    n, t, g = 8, 5, 4
    rewards = torch.tensor([1.0, 0.0, 1.0, float("nan"), 0.0, 0.0, 0.0, 0.0])
    mask = torch.ones(n, t)
    mask[1, 3:] = 0
    mask[5] = 0  # an empty completion
    if variant.stage == "advantages":
        if "completion_lengths" in variant.requires:
            kwargs["completion_lengths"] = mask.sum(-1)
        if "prompt_keys" in variant.requires:  # as the trainer fills: one key per prompt, shared by its group
            kwargs["prompt_keys"] = torch.arange(n) // g
        if "prompt_value_logits" in variant.requires:  # the value model's V(x) logit of each row's prompt
            kwargs["prompt_value_logits"] = torch.randn(n)
        if "prompt_kl" in variant.requires:  # as the trainer fills: one drift per prompt, NaN for a prompt never seen
            kwargs["prompt_kl"] = torch.tensor([0.03] * g + [float("nan")] * g, dtype=torch.float64)
        for name in ("greedy_baseline_rewards", "reference_sample_rewards"):  # one baseline per rollout, one NaN
            if name in variant.requires:
                kwargs[name] = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, float("nan")])
        if "judge_scores" in variant.requires:  # as the trainer fills: the judge's scores on the all-negative group
            kwargs["judge_scores"] = torch.tensor([float("nan")] * g + [0.5, 0.0, 1.0, float("nan")])
        if "pair_similarity" in variant.requires:  # as the trainer fills: one G x G matrix per group, one NaN pair
            sim = torch.eye(g).repeat(n // g, 1, 1)
            sim[0, 0, 1] = sim[0, 1, 0] = 0.95
            sim[1, 0, 1] = float("nan")
            kwargs["pair_similarity"] = sim
        if "step_structure" in variant.requires:  # per-step output: two turns per episode, a shared first state
            from trl_groupx.advantages.step_credit import StepBatch

            modules = [["plan", "answer"]] * n if "step_modules" in variant.requires else None  # as the trainer fills
            steps = StepBatch.from_lists([["s0", f"s{i % 3}"] for i in range(n)],
                                         [[0.0, float(i % 2)] for i in range(n)], modules=modules)
            if "counterfactual_rewards" in variant.requires:  # CCPO: a two-agent team, each episode's run without
                # its credited agent (the config's default name) scored, one NaN
                steps.module = StepBatch.from_lists([["s0", "s1"]] * n, modules=[["thinker", "solver"]] * n).module
                kwargs["counterfactual_rewards"] = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, float("nan"), 0.0, 1.0])
            out = variant.fn(rewards, g, steps=steps, **kwargs)
            assert out.shape == (2 * n,) and torch.isfinite(out).all() and (out[steps.episode == 3] == 0).all()
        else:
            out = variant.fn(rewards, g, **kwargs)
            if isinstance(out, tuple):  # (advantages, keep): the variant also leaves rollouts out
                out, keep = out
                assert keep.shape == (n,) and keep.dtype == torch.bool
            assert out.shape == (n,) and torch.isfinite(out).all() and out[3] == 0
    elif variant.stage == "token_weights":
        logps = -torch.rand(n, t)
        ctx = TokenContext(mask, g, entropies=torch.rand(n, t) * 2, logps=logps, ref_logps=logps - 0.1 * torch.rand(n, t),
                           rewards=rewards, completion_ids=torch.randint(0, 5, (n, t)))  # the trainer always fills ids
        if "sum_pi_squared" in variant.requires:  # filled by the trainer only for variants that require it
            ctx.sum_pi_squared = logps.exp() ** 2 + 0.1 * torch.rand(n, t)
        if "rewards_per_func" in variant.requires:  # (N, K), as the trainer fills for token variants that require it
            ctx.rewards_per_func = torch.stack([rewards, 1.0 - rewards], dim=1)
        if "token_blocks" in variant.requires:  # two blocks, the last token outside both, -1 on padding
            blocks = (torch.arange(t) >= 2).long().repeat(n, 1)
            blocks[:, -1] = -1
            ctx.token_blocks = torch.where(mask.bool(), blocks, -1)
        if "contrast_logps" in variant.requires:  # log-probs under the negative prompts, as the trainer fills them
            ctx.contrast_logps = logps - torch.rand(n, t)
        if "intra_group_token_divergence" in variant.requires:  # one D_t per group on all its rows, 0 past its end
            group_d = torch.rand(n // g, t).repeat_interleave(g, dim=0)
            ctx.intra_group_token_divergence = group_d * mask.view(n // g, g, t).any(1).repeat_interleave(g, dim=0)
        if "tempered_logps" in variant.requires:  # log-probs at the variant's temperatures, 0 on padding
            from trl_groupx.token_weights.tempered_logps import logp_temperatures_field

            m = len(getattr(config, logp_temperatures_field(variant.params)))
            ctx.tempered_logps = (logps[..., None] - 0.5 * torch.rand(n, t, m)) * mask[..., None]
        if "dpo_logps" in variant.requires:  # the DPO model's log-probs of the sampled tokens, as the trainer fills
            ctx.dpo_logps = logps - 0.5 * torch.rand(n, t)
        if "answer_belief" in variant.requires:  # segments 0,0,1,1,2 and the answer log-probs at their 4 boundaries
            ctx.belief_segment_ids = torch.where(mask.bool(), torch.tensor([0, 0, 1, 1, 2]).repeat(n, 1), -1)
            ctx.answer_belief_logps = torch.full((n, config.belief_probe_max_segments + 1), float("nan"))
            ctx.answer_belief_logps[:, :4] = -torch.rand(n, 4) * 3
        if "prm_step_scores" in variant.requires:  # as the trainer fills: steps and PRM scores of the degenerate group
            steps = torch.tensor([0, 0, 1, 1, 2]).repeat(n, 1)
            ctx.prm_step_ids = torch.where(mask.bool() & (torch.arange(n) >= g)[:, None], steps, -1)
            ctx.prm_step_scores = torch.full((n, 3), float("nan"))
            ctx.prm_step_scores[g:] = torch.tensor([[0.5, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
            ctx.prm_step_scores[5] = float("nan")  # the empty completion has no step
        if "segment_mc_values" in variant.requires:  # MC values at cut tokens 1 and 3, NaN elsewhere (as filled)
            ctx.segment_mc_values = torch.full((n, t), float("nan"))
            ctx.segment_mc_values[:, 1], ctx.segment_mc_values[:, 3] = torch.rand(n), torch.rand(n)
        out = variant.fn(torch.zeros(n), ctx, **kwargs)
        assert out.shape == (n, t) and torch.isfinite(out).all() and (out[mask == 0] == 0).all()
    elif variant.stage == "objective":
        logps = (-torch.rand(n, t)).requires_grad_()
        group_ids = torch.arange(n) // g if "group_structure" in variant.requires else None  # as the trainer fills
        ctx = ObjectiveContext(logps, logps.detach() - 0.1 * torch.randn(n, t), torch.randn(n, 1), mask,
                               entropies=torch.rand(n, t) * 2, group_ids=group_ids)  # the trainer always passes them
        if "teacher_logps" in variant.requires:  # the teacher's log-probs of the sampled tokens, as the trainer fills
            ctx.teacher_logps = logps.detach() - torch.rand(n, t)
        if "nll_anchor_weights" in variant.requires:  # per-rollout NLL weights, 0 on rollouts that were not correct
            ctx.anchor_weights = torch.rand(n) * (torch.rand(n) > 0.5)
        if "self_teacher_topk" in variant.requires:  # routed rows, entropy weights, top-3 log-probs, as the trainer fills
            from trl_groupx.objective.self_teacher import SelfDistillBatch

            routed = torch.arange(n) % 2 == 1
            student = (torch.log(0.9 * torch.softmax(torch.randn(n, t, 3), -1))).requires_grad_()
            ctx.self_distill = SelfDistillBatch(routed, torch.rand(n, t) * mask * routed[:, None],
                                                torch.log(0.8 * torch.softmax(torch.randn(n, t, 3), -1)), student)
        out = variant.fn(ctx, **kwargs)
        assert out.shape[0] == n and out.shape[1] in (1, t) and torch.isfinite(out).all()
        (out * mask).sum().backward()
        assert torch.isfinite(logps.grad).all() and (logps.grad[mask == 0] == 0).all()


def test_selectors_are_config_fields():
    assert set(SELECTORS.values()) <= CONFIG_FIELDS


def test_registration_is_strict():
    def fn(rewards, group_size):
        """x"""
        return rewards

    common = dict(name="x", paper="arXiv:0000.00000", official_code=None, stage="advantages")
    with scoped_variants():
        with pytest.raises(ValueError, match="already registered"):
            register("sign_adv", **common)(fn)
        with pytest.raises(ValueError, match="snake case"):
            register("Bad-Id", **common)(fn)
        with pytest.raises(ValueError, match="must set advantage_estimator='other'"):
            register("other", **common, flags={"advantage_estimator": "x"})(fn)
        with pytest.raises(ValueError, match="unknown inputs"):
            register("needs_magic", **common, requires=("magic",))(fn)
        register("throwaway", **common)(fn)
        assert trl_groupx.get_variant("throwaway").fn is fn
    with pytest.raises(KeyError, match="No variant 'throwaway'"):
        trl_groupx.get_variant("throwaway")  # scoped registrations do not leak
