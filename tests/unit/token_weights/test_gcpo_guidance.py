"""GCPO guidance-contrast token weights: the official numbers on a hand-built fixture, the rank power law (mean 1 per
completion, signs kept, largest divergence → largest |A|), ties (position ramp vs average), clamps, padding, NaN
and ±inf rewards, group sizes, flag validation and negative-prompt construction."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import gcpo_guidance_token_advantages
from trl_groupx.token_weights.gcpo_guidance import (
    apply_negative_template,
    guidance_divergence,
    negative_prompts,
    rank_power_alpha,
    resolve_negative_prompt_fn,
)

DEFAULTS = dict(gcpo_guidance_top_fraction=0.4, gcpo_guidance_top_mass=0.8, gcpo_guidance_ties="position")
# α = log(1 − 0.8) / log(1 − 0.4) − 1 = (−1.6094379) / (−0.5108256) − 1
ALPHA = 2.150660103087123


def shout_negative(prompt):
    """A user negative-prompt function (importable by dotted path)."""
    return prompt.upper() if isinstance(prompt, str) else [{**m, "content": m["content"].upper()} for m in prompt]


def weights_of(pos, neg, mask, advantages=None, group_size=None, rewards=None, **flags):
    n = pos.shape[0]
    adv = torch.ones(n) if advantages is None else advantages
    ctx = TokenContext(mask, group_size or n, logps=pos, contrast_logps=neg, rewards=rewards)
    return gcpo_guidance_token_advantages(adv, ctx, **{**DEFAULTS, **flags})


def test_alpha_from_top_fraction_and_mass():
    assert rank_power_alpha(0.4, 0.8) == pytest.approx(ALPHA, abs=1e-12)
    # x = y: p^0 = 1, uniform weights
    assert rank_power_alpha(0.3, 0.3) == pytest.approx(0.0, abs=1e-12)


def test_official_fixture_numbers():
    # Completion of 3 real tokens (+1 padding); lp_neg − lp_pos = [−0.5, 0, 0.5]:
    #   k3 D = e^d − d − 1 = [e^−.5 − .5, 0, e^.5 − 1.5] = [0.1065307, 0, 0.1487213]
    #   ranks (lowest first) = [2, 1, 3] → p = [2/3, 1/3, 1]
    #   w = 3 p^α / Σ p^α with α = 2.1506601: [0.8294301, 0.1867956, 1.9837743]; A = −2 → A·w
    pos = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    neg = torch.tensor([[-1.5, -2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    torch.testing.assert_close(guidance_divergence(pos, neg)[0, :3],
                               torch.tensor([0.10653066, 0.0, 0.14872127]), atol=1e-6, rtol=0)
    out = weights_of(pos, neg, mask, advantages=torch.tensor([-2.0]))
    expected = -2.0 * torch.tensor([0.8294301344833178, 0.18679558548828318, 1.983774280028399, 0.0])
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=0)


def test_official_clamps():
    # d = ±30 is clamped to ±20: D(+20) = e^20 − 21 → clamp 10; D(−20) = e^−20 + 19 → clamp 10; both 10, a tie
    pos = torch.tensor([[0.0, -30.0, -1.0]])
    neg = torch.tensor([[-30.0, 0.0, -1.0]])
    div = guidance_divergence(pos, neg)
    torch.testing.assert_close(div, torch.tensor([[10.0, 10.0, 0.0]]))
    # ties ranked by position: the third token (D = 0) has rank 1, then token 0 rank 2, token 1 rank 3
    out = weights_of(pos, neg, torch.ones(1, 3))
    torch.testing.assert_close(out[0], torch.tensor([0.8294301344833178, 1.983774280028399, 0.18679558548828318]),
                               atol=1e-5, rtol=0)


def test_identical_prompts_position_ramp_official_and_average_gives_grpo():
    pos = -torch.rand(2, 5)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    adv = torch.tensor([1.5, -0.5])
    # official ("position"): D ≡ 0, ranks 1..4 by position → p = [.25, .5, .75, 1], w = 4 p^α / Σ p^α
    ramp = weights_of(pos, pos.clone(), mask, advantages=adv)
    torch.testing.assert_close(
        ramp[0], 1.5 * torch.tensor([0.11180466823825572, 0.496447283645983, 1.18736866644031, 2.204379381675451,
                                     0.0]), atol=1e-5, rtol=0)
    assert (ramp[1].diff() < 0).all()  # negative advantage: |A| grows along the completion
    # "average": every token shares the mean rank → p equal → w = 1, the sequence advantage on every token (GRPO)
    flat = weights_of(pos, pos.clone(), mask, advantages=adv, gcpo_guidance_ties="average")
    torch.testing.assert_close(flat, adv[:, None] * mask.float())


def test_average_ties_share_their_mean_rank():
    # D = [0, c, c, 2c'] with two tied middle values: ranks [1, 2.5, 2.5, 4] → p = [.25, .625, .625, 1]
    pos = torch.zeros(1, 4)
    neg = torch.tensor([[0.0, -1.0, -1.0, -2.0]])  # D(−1) = e^−1 = 0.3679, D(−2) = e^−2 + 1 = 1.1353
    out = weights_of(pos, neg, torch.ones(1, 4), gcpo_guidance_ties="average")
    p = torch.tensor([0.25, 0.625, 0.625, 1.0], dtype=torch.float64) ** ALPHA
    torch.testing.assert_close(out[0], (4 * p / p.sum()).float(), atol=1e-5, rtol=0)


def test_rank_power_properties():
    torch.manual_seed(0)
    n, t = 6, 9
    pos, neg = -torch.rand(n, t) * 3, -torch.rand(n, t) * 3
    lengths = torch.tensor([9, 7, 5, 1, 3, 8])
    mask = (torch.arange(t) < lengths[:, None]).long()
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.7, -0.3])
    out = weights_of(pos, neg, mask, advantages=adv, group_size=3)
    w = out / adv[:, None]
    real = mask.bool()
    assert (w[real] > 0).all() and (out[~real] == 0).all()
    torch.testing.assert_close((w * mask).sum(1) / lengths, torch.ones(n))  # mean 1 per completion
    assert (torch.sign(out[real]) == torch.sign(adv[:, None].expand(n, t)[real])).all()  # signs follow A
    div = guidance_divergence(pos, neg)
    for i in range(n):  # the largest divergence gets the largest |A|; order of weights = order of divergences
        d, a = div[i][real[i]], out[i][real[i]].abs()
        assert a.argmax() == d.argmax()
        assert torch.equal(d.argsort(), a.argsort())
    assert out[3, 0] == adv[3]  # one real token: weight 1


def test_padding_never_read():
    pos, neg = -torch.rand(2, 5), -torch.rand(2, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    clean = weights_of(pos, neg, mask, advantages=torch.tensor([1.0, -1.0]))
    dirty_pos, dirty_neg = pos.clone(), neg.clone()
    dirty_pos[mask == 0] = float("nan")
    dirty_neg[mask == 0] = -1e9  # would rank first / clamp if read
    dirty = weights_of(dirty_pos, dirty_neg, mask, advantages=torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(dirty, clean)
    assert torch.isfinite(dirty).all() and (dirty[mask == 0] == 0).all()


def test_nan_rewards_zero_and_inf_rewards_error():
    pos, neg = -torch.rand(4, 3), -torch.rand(4, 3)
    mask = torch.ones(4, 3)
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    adv = torch.tensor([0.5, float("nan"), -1.0, 0.5])
    out = weights_of(pos, neg, mask, advantages=adv, group_size=4, rewards=rewards)
    assert torch.isfinite(out).all() and (out[1] == 0).all() and (out[0] > 0).all() and (out[2] < 0).all()
    with pytest.raises(ValueError, match="inf"):
        weights_of(pos, neg, mask, group_size=4, rewards=torch.tensor([1.0, float("inf"), 0.0, 1.0]))


def test_group_sizes_all_equal_empty_completion_and_missing_inputs():
    pos, neg = -torch.rand(4, 3), -torch.rand(4, 3)
    mask = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 0, 0]])  # row 1 empty, rows 2-3 truncated
    for g in (1, 2, 4):
        out = weights_of(pos, neg, mask, advantages=torch.tensor([1.0, 2.0, -1.0, 0.5]), group_size=g)
        assert torch.isfinite(out).all() and (out[1] == 0).all() and (out[mask == 0] == 0).all()
    # all-equal group: GRPO advantages are 0, so are the token advantages
    assert (weights_of(pos, neg, torch.ones(4, 3), advantages=torch.zeros(4), group_size=4) == 0).all()
    with pytest.raises(ValueError, match="groups of 3"):
        weights_of(pos, neg, mask, group_size=3)
    with pytest.raises(ValueError, match="contrast_logps"):
        gcpo_guidance_token_advantages(torch.ones(4), TokenContext(mask, 4, logps=pos), **DEFAULTS)


@pytest.mark.parametrize(
    "flags, match",
    [
        (dict(gcpo_guidance_top_fraction=1.0), "gcpo_guidance_top_fraction"),
        (dict(gcpo_guidance_top_mass=0.0), "gcpo_guidance_top_mass"),
        (dict(gcpo_guidance_top_fraction=0.6, gcpo_guidance_top_mass=0.5), "top_mass >= top_fraction"),
        (dict(gcpo_guidance_ties="random"), "gcpo_guidance_ties"),
        (dict(gcpo_guidance_negative_template=" "), "gcpo_guidance_negative_template"),
        (dict(gcpo_guidance_negative_prompt_fn="no_such_module.fn"), "cannot be imported"),
        (dict(gcpo_guidance_negative_prompt_fn="justaname"), "package.module.function"),
    ],
)
def test_bad_flags_fail_at_config(tmp_path, flags, match):
    with pytest.raises(ValueError, match=match):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="gcpo_guidance",
                              **flags)


def test_flags_need_the_variant(tmp_path):
    with pytest.raises(ValueError, match="gcpo_guidance"):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gcpo_guidance_ties="average")


def test_negative_template_on_text_and_conversational_prompts():
    template = "{prompt}, but generate the wrong answer"
    assert apply_negative_template("2+2=", template) == "2+2=, but generate the wrong answer"
    assert apply_negative_template("2+2=", "answer the question") == "answer the question"  # template w/o prompt
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3="}]
    out = apply_negative_template(conv, template)
    assert out[:3] == conv[:3] and out[3] == {"role": "user", "content": "3+3=, but generate the wrong answer"}
    assert conv[3]["content"] == "3+3="  # input untouched
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    out = apply_negative_template(parts, template + "!")
    assert out[0]["content"][1]["text"] == "What is it?, but generate the wrong answer!"
    assert parts[0]["content"][1]["text"] == "What is it?"
    with pytest.raises(ValueError, match="gcpo_guidance_negative_prompt_fn"):
        apply_negative_template([{"role": "system", "content": "x"}], template)


def test_negative_prompt_fn_by_dotted_path(tmp_path):
    path = f"{__name__}.shout_negative"
    assert resolve_negative_prompt_fn(path) is shout_negative
    assert resolve_negative_prompt_fn(f"{__name__}:shout_negative") is shout_negative
    config = trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, token_weighting="gcpo_guidance",
                                   gcpo_guidance_negative_prompt_fn=path)
    assert negative_prompts(["abc", [{"role": "user", "content": "q"}]], config) == [
        "ABC", [{"role": "user", "content": "Q"}]]
    default = trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                                    token_weighting="gcpo_guidance")
    assert negative_prompts(["abc"], default) == ["abc, but generate the wrong answer"]


def test_registered_defaults_are_the_official_ones():
    v = trl_groupx.get_variant("gcpo_guidance")
    assert v.requires == ("old_logps", "contrast_logps")
    assert v.flags["gcpo_guidance_top_fraction"] == 0.4 and v.flags["gcpo_guidance_top_mass"] == 0.8
    assert v.flags["epsilon"] == 0.2 and v.flags["epsilon_high"] == 0.28 and v.flags["dual_clip_c"] == 3.0
    assert math.isclose(rank_power_alpha(v.flags["gcpo_guidance_top_fraction"], v.flags["gcpo_guidance_top_mass"]),
                        ALPHA)
