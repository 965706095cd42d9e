"""GCPO guidance contrast on the tiny model: one real step, full and LoRA. The negative-prompt forward really runs on
the negative prompts (spy on the trainer's prompt tokenisation, and an independent forward of one row); the token
advantages the trainer trains on are the function's on the recorded inputs; the gradient differs from GRPO's;
composition with the dual-clip objective, a user negative-prompt function and the chunked log-prob path."""

import copy

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.token_weights import gcpo_guidance_token_advantages

SUFFIX = ", but generate the wrong answer"


def wrong_way_prompt(prompt):
    """User negative prompt (dotted path in the config): the question turned into a request for a wrong result."""
    return [{"role": "user", "content": "Give a wrong result for " + prompt[-1]["content"]}]


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def capture(trainer):
    """Record every prompt list the trainer tokenises, the token context and sequence advantages entering the token
    stage, and the (unshuffled) batch leaving it."""
    seen = {"tokenized": []}
    tokenize, context = trainer._tokenize_prompts, trainer._token_context
    compute, generate = trainer.compute_advantages, trainer._generate_and_score_completions

    def tokenize_prompts(prompts):
        seen["tokenized"].append(copy.deepcopy(prompts))
        return tokenize(prompts)

    def token_context(output, rewards, group_size):
        seen["ctx"] = context(output, rewards, group_size)
        seen["prompt_mask"] = output["prompt_mask"].clone()
        return seen["ctx"]

    def compute_advantages(*args, **kwargs):
        seen["seq"] = compute(*args, **kwargs).clone()
        return seen["seq"]

    def generate_and_score(inputs):
        seen["prompts"] = [row["prompt"] for row in inputs]
        out = generate(inputs)
        seen.update(token=out["advantages"].clone(), mask=out["completion_mask"].clone(),
                    ids=out["completion_ids"].clone())
        return out

    trainer._tokenize_prompts, trainer._token_context = tokenize_prompts, token_context
    trainer.compute_advantages, trainer._generate_and_score_completions = compute_advantages, generate_and_score
    return seen


def independent_negative_logps(trainer, messages, completion):
    """log π(y_t | negative prompt, y_<t) of one completion, from a plain forward of the chat-templated text."""
    tok = trainer.processing_class
    prompt_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    prompt_ids = torch.tensor(prompt_ids["input_ids"]).view(1, -1)
    ids = torch.cat([prompt_ids, completion.view(1, -1)], dim=1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids).logits[:, prompt_ids.size(1) - 1 : -1].float() / trainer.temperature
    return logits.log_softmax(-1).gather(-1, completion.view(1, -1, 1)).view(-1)


@pytest.mark.parametrize("peft", [False, True])
def test_negative_prompt_forward_weights_and_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "gcpo", peft, loss_type="dapo", token_weighting="gcpo_guidance")
    seen = capture(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same shuffle

    # the generation tokenised the real prompts; the extra forward tokenised their negative versions, row for row
    assert len(seen["tokenized"]) == 2
    real, negative = seen["tokenized"]
    assert real == seen["prompts"]
    assert negative == [[{**p[-1], "content": p[-1]["content"] + SUFFIX}] for p in seen["prompts"]]

    ctx, mask = seen["ctx"], seen["mask"]
    assert torch.equal(ctx.completion_mask, mask) and ctx.contrast_logps.shape == mask.shape
    # an independent forward of row 0 (real tokens only) under its negative prompt gives the recorded log-probs
    n0 = int(mask[0].sum())
    expected_row = independent_negative_logps(trainer, negative[0], seen["ids"][0, :n0])
    torch.testing.assert_close(ctx.contrast_logps[0, :n0], expected_row, atol=1e-4, rtol=1e-4)
    # ... and they differ from the log-probs under the real prompt (the negative prompt changes the predictions)
    assert not torch.allclose(ctx.contrast_logps[mask.bool()], ctx.logps[mask.bool()], atol=1e-3)

    # the token advantages the trainer trains on are the function's on the recorded inputs
    expected = gcpo_guidance_token_advantages(
        seen["seq"], ctx, gcpo_guidance_top_fraction=0.4, gcpo_guidance_top_mass=0.8, gcpo_guidance_ties="position")
    torch.testing.assert_close(seen["token"], expected)
    # weights average 1 per completion: the mean token advantage is the sequence advantage; the tokens differ
    lengths = mask.sum(1).clamp(min=1)
    torch.testing.assert_close((seen["token"] * mask).sum(1) / lengths, seen["seq"] * (mask.sum(1) > 0), atol=1e-5,
                               rtol=1e-5)
    varied = (mask.sum(1) > 1) & (seen["seq"] != 0)
    assert varied.any() and all(seen["token"][i][mask[i].bool()].unique().numel() > 1 for i in varied.nonzero())
    assert grads_differ(base_grads, grads)
    if peft:
        assert grads and all("lora_" in name for name in grads)  # only the adapter trains


@pytest.mark.parametrize(
    "flags",
    [
        # the paper's objective: dual clip c = 3 with clip 0.2 / 0.28
        dict(loss_type="dual_clip", dual_clip_c=3.0, epsilon=0.2, epsilon_high=0.28),
        # a user negative-prompt function, mean ranks on ties, the chunked LM-head path for both forwards
        dict(loss_type="grpo", gcpo_guidance_ties="average", logps_chunk_size=2,
             gcpo_guidance_negative_prompt_fn=f"{__name__}.wrong_way_prompt"),
    ],
)
def test_composes_with_objectives_and_user_negative_prompts(tmp_path, flags):
    base_flags = {k: v for k, v in flags.items() if not k.startswith("gcpo_guidance")}
    _, base_grads, _ = one_step(ours(tmp_path / "base", **base_flags))
    trainer = ours(tmp_path / "ours", token_weighting="gcpo_guidance", **flags)
    seen = capture(trainer)
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    if "gcpo_guidance_negative_prompt_fn" in flags:
        assert seen["tokenized"][-1] == [wrong_way_prompt(p) for p in seen["prompts"]]
    assert grads_differ(base_grads, grads)


def test_identical_negative_prompt_reproduces_the_rollout_logps(tmp_path):
    # template "{prompt}": the extra forward sees exactly the rollout's input (same ids, padding and batch), so on
    # the CPU it gives the same log-probs bit for bit; with mean ranks on ties every weight is then 1 and the token
    # advantages are GRPO's broadcast advantages (the catalog's check; the official position ties give a ramp)
    trainer = ours(tmp_path, loss_type="dapo", token_weighting="gcpo_guidance", gcpo_guidance_ties="average",
                   gcpo_guidance_negative_template="{prompt}")
    seen = capture(trainer)
    one_step(trainer)
    ctx, mask = seen["ctx"], seen["mask"].bool()
    assert torch.equal(ctx.contrast_logps[mask], ctx.logps[mask])
    torch.testing.assert_close(seen["token"], seen["seq"][:, None] * mask)
