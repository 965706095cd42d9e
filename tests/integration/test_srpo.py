"""SRPO (`loss_type="srpo"`) on the tiny model: the loss of a real generation batch recomputed from scratch (GRPO's
surrogate on the other rows, the entropy-weighted full-vocabulary JS to the policy re-prompted with the group's
correct completion on the routed rows, one token denominator), full and LoRA; the gradient changes against GRPO;
no correct rollout gives GRPO's gradient; composition with an advantage variant; the EMA teacher; construction
errors."""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_split_invariant, loss_and_grads, ours

PEFT = [False, True]
SRPO = dict(loss_type="srpo")
# TRL's SDPOConfig defaults, which the teacher prompts follow (reprompt_template, solution_template)
REPROMPT = "{prompt}\nCorrect solution:\n\n{solution}\n\n\n\nCorrectly solve the original question.\n"


def _generation_batch(trainer, seed=0):
    """The rows and the generation output in group order (before TRL shuffles them for the micro-batches)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(seed)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(seed)
    return batch, trainer._generate_and_score_completions(batch)


def _completion_logps(model, prompt_ids, completion_ids, completion_len):
    """Full-vocabulary log-probs (T, V) of one row's completion positions after `prompt_ids` (no padding)."""
    ids = torch.cat([prompt_ids, completion_ids])[None]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    start = prompt_ids.numel() - 1
    return logits[start : start + completion_len].log_softmax(-1)


def _expected_loss(trainer, batch, out):
    """(Σ over unrouted loss tokens of −A_i + Σ over routed loss tokens of w·JS) / all loss tokens, on-policy."""
    tok, model = trainer.processing_class, trainer.model
    rewards = trainer._rewards_per_func.squeeze(1)
    group_size = trainer.num_generations
    mask = out["completion_mask"].float()
    routed = [i for i in range(len(batch)) if rewards[i] < 1
              and any(rewards[j] >= 1 for j in range(i - i % group_size, i - i % group_size + group_size))]
    pg = sum(-out["advantages"][i] * mask[i].sum() for i in range(len(batch)) if i not in routed)
    entropies, divergences = [], []
    for i in routed:
        start = i - i % group_size
        demo = next(j for j in range(start, start + group_size) if rewards[j] >= 1)  # the group's first correct
        demo_ids = out["completion_ids"][demo][out["completion_ids"][demo] != tok.pad_token_id]
        solution = tok.decode(demo_ids, skip_special_tokens=True)
        user = batch[i]["prompt"][-1]["content"]
        messages = [{"role": "user", "content": REPROMPT.format(prompt=user, solution=solution)}]
        teacher_prompt = torch.tensor(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                              return_dict=True)["input_ids"])
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()]
        n = int(mask[i].sum())
        completion = out["completion_ids"][i][:n]
        teacher = _completion_logps(model, teacher_prompt, completion, n)
        student = _completion_logps(model, prompt, completion, n)
        m = torch.logsumexp(torch.stack([teacher, student]) + math.log(0.5), dim=0)
        js = 0.5 * (teacher.exp() * (teacher - m)).sum(-1) + 0.5 * (student.exp() * (student - m)).sum(-1)
        entropies.append(-(teacher.exp() * teacher).sum(-1))
        divergences.append(js)
    h, js = torch.cat(entropies), torch.cat(divergences)
    weights = torch.exp(-h) / torch.exp(-h).mean()
    return (pg + (weights * js).sum()) / mask.sum(), routed


@pytest.mark.parametrize("peft", PEFT)
def test_loss_recomputed_from_scratch_and_gradient_differs_from_grpo(tmp_path, peft):
    # top-k = the whole vocabulary of the tiny model (104): the top-k JS with its tail is the full JS
    trainer = ours(tmp_path / "srpo", peft, **SRPO, srpo_distill_topk=104)
    batch, out = _generation_batch(trainer)
    expected, routed = _expected_loss(trainer, batch, out)
    assert routed and out["groupx_srpo_routed"].nonzero().squeeze(1).tolist() == routed
    loss, grads = loss_and_grads(trainer, out)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-4)

    # against plain GRPO with the same normaliser (TRL's dapo: global token mean), same rollouts
    loss_grpo, g_grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft, loss_type="dapo"))
    _, g_srpo, inputs = one_step(ours(tmp_path / "srpo2", peft, **SRPO))
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])
    assert grads_differ(g_grpo, g_srpo)


@pytest.mark.parametrize("peft", PEFT)
def test_no_correct_rollout_gives_grpo_gradient(tmp_path, peft):
    # threshold above every reward: no group has a correct rollout, every failed row stays on GRPO
    _, g_grpo, _ = one_step(ours(tmp_path / "grpo", peft, loss_type="dapo"))
    _, grads, inputs = one_step(ours(tmp_path / "none", peft, **SRPO, srpo_success_threshold=2.0))
    assert not inputs["groupx_srpo_routed"].any() and inputs["groupx_srpo_weights"].eq(0).all()
    for k in g_grpo:
        torch.testing.assert_close(grads[k], g_grpo[k], atol=1e-6, rtol=1e-5)


def test_micro_batch_split_does_not_change_the_loss(tmp_path):
    # weights normalised over the generation batch, one token denominator: two micro-batches = one, off-policy too
    # (on this batch one micro-batch holds the routed row and the other none: both loss-forward paths run)
    assert_split_invariant(ours(tmp_path, **SRPO, per_device_train_batch_size=4, gradient_accumulation_steps=2))


def test_groups_without_a_correct_rollout_are_not_routed(tmp_path):
    trainer = ours(tmp_path, **SRPO)
    _, out = _generation_batch(trainer)
    rewards = trainer._rewards_per_func.squeeze(1).view(-1, trainer.num_generations)
    routed = out["groupx_srpo_routed"].view(-1, trainer.num_generations)
    assert torch.equal(routed, (rewards < 1) & (rewards >= 1).any(dim=1, keepdim=True))


def test_composes_with_an_advantage_variant(tmp_path):
    _, base, _ = one_step(ours(tmp_path / "a", **SRPO))
    trainer = ours(tmp_path / "b", **SRPO, advantage_estimator="sign_adv")
    _, grads, inputs = one_step(trainer)
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0} and inputs["groupx_srpo_routed"].any()
    assert grads_differ(base, grads)
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("peft", PEFT)
def test_ema_teacher_moves_towards_the_policy(tmp_path, peft):
    trainer = ours(tmp_path, peft, **SRPO, srpo_teacher_update_rate=0.25)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if peft:  # TRL's PEFT EMA: a second adapter, zero-initialised, shadow ← 0.75·shadow + 0.25·student
        trainer.train()
        student = {n: p.detach() for n, p in model.named_parameters() if ".default." in n and "lora_" in n}
        teacher = {n.replace(".default.", ".srpo_teacher."): p for n, p in student.items()}
        params = dict(model.named_parameters())
        for name, value in teacher.items():
            torch.testing.assert_close(params[name].detach(), 0.25 * value)
    else:  # full model: a frozen copy, teacher ← 0.75·teacher + 0.25·student after the step
        copy = trainer._self_teacher.copy
        before = {n: p.detach().clone() for n, p in copy.named_parameters()}
        trainer.train()
        after = dict(copy.named_parameters())
        moved = False
        for name, p in model.named_parameters():
            torch.testing.assert_close(after[name], 0.75 * before[name] + 0.25 * p.detach(), atol=1e-6, rtol=1e-5)
            moved = moved or not torch.equal(after[name], before[name])
        assert moved


def test_plain_text_prompts_and_evaluation(tmp_path):
    from trl_groupx.toy import arithmetic_dataset

    text = arithmetic_dataset(64, seed=0).map(lambda row: {"prompt": row["prompt"][-1]["content"]})
    trainer = ours(tmp_path, **SRPO, dataset=text)
    loss, grads, inputs = one_step(trainer)  # the teacher prompt is the text prompt + SDPO's templates
    assert inputs["groupx_srpo_routed"].any() and torch.isfinite(loss)
    assert (inputs["groupx_srpo_teacher_topk_logps"][inputs["groupx_srpo_routed"]] < 0).all()
    trainer.model.eval()  # evaluation batches are routed with the eval group size and give a finite loss
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    out = trainer._generate_and_score_completions(batch)
    with torch.no_grad():
        assert torch.isfinite(trainer.compute_loss(trainer.model, out))
    assert out["groupx_srpo_weights"].shape == out["completion_mask"].shape


@pytest.mark.parametrize("kind", ["live", "base"])
def test_other_teacher_kinds_train(tmp_path, kind):
    trainer = ours(tmp_path, True, **SRPO, srpo_teacher_kind=kind)
    loss, grads, inputs = one_step(trainer)
    assert inputs["groupx_srpo_routed"].any() and torch.isfinite(loss)
    assert trainer._self_teacher.copy is None  # LoRA: the same model, adapters switched or not


def test_registry_flags_and_cli_listing(tmp_path, capsys):
    from trl_groupx.cli import main

    config = trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **trl_groupx.get_variant("srpo").flags)
    assert config.loss_type == "srpo" and config.loss_aggregation == "global_token_mean"
    try:
        main(["list"])
    except SystemExit:
        pass
    assert "srpo" in capsys.readouterr().out
