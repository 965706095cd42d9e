"""GRPO-VPS belief probing on the tiny model: the answer log-probs the trainer probes equal independent unpadded
forwards; one probe per distinct boundary; a belief patched to jump at boundary 2 credits the second segment only,
and most; λ = 0 gives GRPO's gradient and λ > 0 changes it (full and LoRA); composition with RLOO advantages and the
dual-clip objective; construction and first-step errors name belief_probe_answer_column."""

import dataclasses
import functools
import math

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import ours
from trl_groupx.token_weights import belief_probe_forward
from trl_groupx.toy import arithmetic_dataset

PEFT = [False, True]
# three segments at most, every completion token a candidate cut: the 6-token toy completions get 1-3 segments
FLAGS = dict(token_weighting="belief_probe", belief_probe_answer_column="answer", belief_probe_max_segments=3,
             belief_probe_entropy_top_fraction=1.0, belief_probe_coef=1.0)


def capture(trainer, monkeypatch):
    """Record the token variant's inputs and output, and the probe requirement's inputs and output."""
    seen = {}
    variant = trainer.variants["token_weights"]

    @functools.wraps(variant.fn)  # the trainer reads the variant's config fields from the signature
    def fn(advantages, ctx, **kwargs):
        out = variant.fn(advantages, ctx, **kwargs)
        seen.update(advantages=advantages.clone(), ctx=ctx, out=out)
        return out

    trainer.variants["token_weights"] = dataclasses.replace(variant, fn=fn)
    real_belief = belief_probe_forward.answer_belief

    def answer_belief(tr, output, entropies):
        segments, logps = real_belief(tr, output, entropies)
        seen.update(output=dict(output), rows=list(tr._rollout_inputs), segments=segments, logps=logps)
        return segments, logps

    monkeypatch.setattr(belief_probe_forward, "answer_belief", answer_belief)
    return seen


def boundaries_of(segments_row, n_tokens, ends_with_eos):
    """Prefix lengths of one row's boundaries, read back from its segment ids."""
    s = int(segments_row.max()) + 1
    starts = [int((segments_row == j).nonzero()[0]) for j in range(s)]
    return starts + [n_tokens - 1 if ends_with_eos else n_tokens]


@pytest.mark.parametrize("peft", PEFT)
def test_probed_beliefs_equal_unpadded_forwards(tmp_path, monkeypatch, peft):
    trainer = ours(tmp_path, peft, **FLAGS)
    seen = capture(trainer, monkeypatch)
    one_step(trainer)
    out, tok = seen["output"], trainer.processing_class
    before = tok("\nThe answer is ", add_special_tokens=False)["input_ids"]  # default template, text before {answer}
    checked = 0
    for i in range(out["completion_ids"].size(0)):
        n = int(out["completion_mask"][i].sum())
        if n == 0:
            assert (seen["segments"][i] == -1).all() and torch.isnan(seen["logps"][i]).all()
            continue
        ids = out["completion_ids"][i, :n].tolist()
        bounds = boundaries_of(seen["segments"][i], n, ids[-1] in trainer.eos_token_ids)
        answer = tok(str(seen["rows"][i]["answer"]), add_special_tokens=False)["input_ids"]
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        for k, c in enumerate(bounds):
            seq = torch.tensor([prompt + ids[:c] + before + answer])
            with torch.no_grad():
                logits = trainer.model(input_ids=seq).logits[0, :-1] / trainer.temperature
            expected = torch.log_softmax(logits, -1).gather(-1, seq[0, 1:, None]).squeeze(-1)[-len(answer):].sum()
            torch.testing.assert_close(seen["logps"][i, k], expected, atol=1e-5, rtol=1e-5)
            checked += 1
        assert torch.isnan(seen["logps"][i, len(bounds):]).all()  # NaN past the row's last boundary
    assert checked > out["completion_ids"].size(0)  # several boundaries per completion


def test_patched_belief_jump_at_boundary_two_credits_the_second_segment(tmp_path, monkeypatch):
    # the policy's belief in the answer: P = 0.1 up to boundary 1, 0.9 from boundary 2 on → ΔP = 0.8 on segment 1
    # (the second segment) of every row that has one, 0 on every other segment
    trainer = ours(tmp_path, **FLAGS)
    seen = capture(trainer, monkeypatch)
    probes = {}
    real_local = belief_probe_forward.local_probes

    def local_probes(*args):
        result = real_local(*args)
        probes["targets"], probes["sequences"] = result[1], result[2]
        return result

    def fake_probe(model, sequences, answer_lengths, **kwargs):
        assert len(sequences) == len(probes["targets"])
        return torch.tensor([math.log(0.9) if min(ks) >= 2 else math.log(0.1) for _, ks in probes["targets"]])

    monkeypatch.setattr(belief_probe_forward, "local_probes", local_probes)
    monkeypatch.setattr(belief_probe_forward, "probe_answer_logps", fake_probe)
    one_step(trainer)
    ctx, adv, out = seen["ctx"], seen["advantages"], seen["out"]
    segments, mask = ctx.belief_segment_ids, ctx.completion_mask.bool()
    n_segments = segments.max(1).values + 1
    assert (n_segments >= 2).sum() >= 4 and (n_segments == 3).any()
    # one probe per distinct boundary: S + 1 per completion, 1 for a completion of only EOS
    ids = seen["output"]["completion_ids"]
    eos_only = (mask.sum(1) == 1) & torch.isin(ids[:, 0], torch.tensor(trainer.eos_token_ids))
    assert len(probes["sequences"]) == int(((n_segments + 1) * mask.any(1)).sum() - eos_only.sum())
    bonus = out - adv[:, None] * mask
    for g in range(0, len(adv), 4):
        rows = range(g, g + 4)
        credited = [i for i in rows if n_segments[i] >= 2]
        if not credited:
            continue
        # group RMS of ΔP over its segments: 0.8 once per credited row
        rms = math.sqrt(0.64 * len(credited) / int(n_segments[g : g + 4].sum()))
        for i in rows:
            second = mask[i] & (segments[i] == 1)
            torch.testing.assert_close(bonus[i][second], torch.full((int(second.sum()),), 0.8 / rms), atol=1e-5,
                                       rtol=0)
            assert (bonus[i][mask[i] & (segments[i] != 1)] == 0).all()  # no other segment is credited
            if second.any():  # the jump's segment has the largest credit of its row
                assert out[i][second].min() > out[i][mask[i] & ~second].max()  # segment 0 is never empty


@pytest.mark.parametrize("peft", PEFT)
def test_gradient_is_grpo_at_lambda_zero_and_differs_otherwise(tmp_path, peft):
    _, grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft))
    _, zero, inputs_zero = one_step(ours(tmp_path / "zero", peft, **{**FLAGS, "belief_probe_coef": 0.0}))
    assert torch.equal(inputs_zero["completion_ids"], inputs_grpo["completion_ids"])
    torch.testing.assert_close(inputs_zero["advantages"],
                               inputs_grpo["advantages"][:, None] * inputs_zero["completion_mask"], atol=1e-6, rtol=0)
    for k in grpo:
        torch.testing.assert_close(zero[k], grpo[k], atol=1e-6, rtol=1e-5)
    _, probed, inputs = one_step(ours(tmp_path / "vps", peft, **FLAGS))
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])
    assert not torch.allclose(inputs["advantages"], inputs_grpo["advantages"][:, None] * inputs["completion_mask"])
    assert grads_differ(grpo, probed)


def test_composes_with_rloo_advantages_and_the_dual_clip_objective(tmp_path):
    composed = dict(advantage_estimator="rloo", loss_type="dual_clip")
    _, base, inputs_base = one_step(ours(tmp_path / "a", True, **composed))
    _, zero, _ = one_step(ours(tmp_path / "b", True, **composed, **{**FLAGS, "belief_probe_coef": 0.0}))
    for k in base:  # λ = 0: RLOO's advantages on every token, the same dual-clip gradient
        torch.testing.assert_close(zero[k], base[k], atol=1e-6, rtol=1e-5)
    loss, grads, inputs = one_step(ours(tmp_path / "c", True, **composed, **FLAGS))
    assert inputs["advantages"].shape == inputs["completion_mask"].shape and torch.isfinite(loss)
    assert grads_differ(base, grads)


def test_construction_and_first_step_errors_name_the_answer_column(tmp_path):
    no_answers = arithmetic_dataset(16, seed=0).remove_columns("answer")
    with pytest.raises(ValueError, match="belief_probe_answer_column='answer', which train_dataset lacks"):
        ours(tmp_path / "a", dataset=no_answers, **FLAGS)
    with pytest.raises(ValueError, match="belief_probe_answer_column='solution', which train_dataset lacks"):
        ours(tmp_path / "b", **{**FLAGS, "belief_probe_answer_column": "solution"})
    blank = arithmetic_dataset(16, seed=0).map(lambda row: {"answer": " "})
    with pytest.raises(ValueError, match="no reference answer in belief_probe_answer_column='answer'"):
        one_step(ours(tmp_path / "c", dataset=blank, **FLAGS))


def test_delimiter_segments_on_the_trainer(tmp_path, monkeypatch):
    # the toy tokenizer is character-level: with delimiter "3" a segment ends right after every "3" of the completion
    # (the first K − 1 = 2 inside it), whatever the entropies
    trainer = ours(tmp_path, **{**FLAGS, "belief_probe_segmentation": "delimiter", "belief_probe_delimiter": "3",
                                "max_completion_length": 8})
    seen = capture(trainer, monkeypatch)
    one_step(trainer)
    out, three = seen["output"], trainer.processing_class.convert_tokens_to_ids("3")
    cut_rows = 0
    for i in range(out["completion_ids"].size(0)):
        n = int(out["completion_mask"][i].sum())
        if n == 0:
            continue
        ids = out["completion_ids"][i, :n].tolist()
        content = n - 1 if ids[-1] in trainer.eos_token_ids else n
        cuts = [t + 1 for t in range(content) if ids[t] == three and t + 1 < content][:2]
        bounds = boundaries_of(seen["segments"][i], n, ids[-1] in trainer.eos_token_ids)
        assert bounds == [0, *cuts, content], (ids, bounds)
        cut_rows += bool(cuts)
    assert cut_rows >= 2  # seed 0: four rows have a "3" before their last character
