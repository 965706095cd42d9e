"""dGRPO on the tiny model: a teacher loaded from a local folder; teacher = student and λ = 0 give GRPO's gradient,
a different teacher adds exactly λ times the sampled reverse KL and changes the gradient; full and LoRA (the adapter
trains, the teacher stays frozen); composition with an advantage variant; construction errors."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import trl_groupx
from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import assert_on_policy_matches, ours
from trl_groupx.objective import aggregate
from trl_groupx.toy import load_tiny_model, load_tiny_tokenizer, tiny_model_path

PEFT = [False, True]


def _save(model, tokenizer, path) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Local teacher folders: `other` (the tiny model with perturbed weights), `small_vocab` (logits for fewer ids
    than the student samples) and `other_tokenizer` (one extra token: ids no longer the student's)."""
    root = tmp_path_factory.mktemp("teachers")
    tokenizer = load_tiny_tokenizer()
    other = load_tiny_model()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    small = load_tiny_model()
    small.resize_token_embeddings(small.config.vocab_size - 4)
    extra_tok = load_tiny_tokenizer()
    extra_tok.add_tokens(["<extra_token>"])
    wider = load_tiny_model()
    wider.resize_token_embeddings(len(extra_tok))
    return {
        "other": _save(other, tokenizer, root / "other"),
        "small_vocab": _save(small, tokenizer, root / "small_vocab"),
        "other_tokenizer": _save(wider, extra_tok, root / "other_tokenizer"),
    }


@pytest.mark.parametrize("peft", PEFT)
def test_teacher_equal_to_student_and_zero_coefficient_give_grpo(tmp_path, peft):
    # the teacher is the student's own checkpoint: k1 ≡ 0 on every token → TRL's GRPO gradient (on-policy)
    assert_on_policy_matches(tmp_path / "same", peft, {"loss_type": "grpo"},
                             {"loss_type": "dgrpo", "opd_teacher_model": tiny_model_path(), "opd_coef": 3.0})
    # λ = 0: no teacher is loaded, the loss is GRPO's
    assert_on_policy_matches(tmp_path / "zero", peft, {"loss_type": "grpo"}, {"loss_type": "dgrpo", "opd_coef": 0.0})
    assert ours(tmp_path / "none", peft, loss_type="dgrpo", opd_coef=0.0)._teacher is None


def test_teacher_equal_to_student_logs_zero_reverse_kl(tmp_path):
    trainer = ours(tmp_path, loss_type="dgrpo", opd_teacher_model=tiny_model_path())
    _, _, inputs = one_step(trainer)
    torch.testing.assert_close(inputs["groupx_teacher_logps"], trainer._get_per_token_logps_and_entropies(
        trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].size(1))[0].detach())
    assert trainer._metrics["train"]["groupx/teacher_reverse_kl"] == [pytest.approx(0.0, abs=1e-6)]


@pytest.mark.parametrize("peft", PEFT)
def test_a_different_teacher_adds_lambda_times_the_reverse_kl(tmp_path, teachers, peft):
    # on-policy, nothing clipped: loss(dGRPO) − loss(GRPO) = λ · mean_i (Σ_t k1_it m_it / |o_i|) with
    # k1 = logp_student − logp_teacher of each sampled token, the teacher's log-probs recomputed here independently
    coef = 0.5
    loss_grpo, g_grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "dgrpo", peft, loss_type="dgrpo", opd_teacher_model=teachers["other"], opd_coef=coef)
    loss, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])  # same rollouts
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    teacher = AutoModelForCausalLM.from_pretrained(teachers["other"])
    with torch.no_grad():
        logits = teacher(input_ids=ids, attention_mask=att).logits[:, -inputs["completion_ids"].size(1) - 1 : -1]
        teacher_logps = torch.log_softmax(logits / trainer.temperature, -1).gather(
            -1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        student_logps = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, inputs["completion_ids"].size(1))[0]
    mask = inputs["completion_mask"]
    torch.testing.assert_close(inputs["groupx_teacher_logps"] * mask, teacher_logps * mask, atol=1e-5, rtol=1e-5)
    k1 = (student_logps - teacher_logps) * mask
    assert k1.abs().max() > 0.05  # the perturbed teacher disagrees
    torch.testing.assert_close(loss - loss_grpo, coef * aggregate(k1, mask, "sequence_mean"), atol=1e-5, rtol=1e-4)
    logged = trainer._metrics["train"]["groupx/teacher_reverse_kl"][-1]
    assert logged == pytest.approx((k1.sum() / mask.sum()).item(), abs=1e-5)
    assert grads_differ(g_grpo, grads)


def test_lora_trains_the_adapter_and_keeps_the_teacher_frozen(tmp_path, teachers):
    trainer = ours(tmp_path, True, loss_type="dgrpo", opd_teacher_model=teachers["other"])
    teacher = trainer._teacher
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert next(teacher.parameters()).device == trainer.accelerator.device
    before_teacher = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert before and all("lora" in n for n in before)
    trainer.train()
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    assert moved
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(before_teacher[n], p) for n, p in teacher.named_parameters())
    assert "groupx/teacher_reverse_kl" in trainer.state.log_history[0]


def test_composes_with_an_advantage_variant(tmp_path, teachers):
    _, base, _ = one_step(ours(tmp_path / "a", loss_type="dgrpo", opd_teacher_model=teachers["other"]))
    _, grads, inputs = one_step(ours(tmp_path / "b", loss_type="dgrpo", opd_teacher_model=teachers["other"],
                                     advantage_estimator="sign_adv"))
    assert set(inputs["advantages"].tolist()) <= {-1.0, 1.0}
    assert "groupx_teacher_logps" in inputs
    assert grads_differ(base, grads)


def test_global_token_mean_aggregation_applies_to_the_added_term(tmp_path, teachers):
    # with loss_aggregation="global_token_mean" the term is Σ k1 m / (tokens of the batch), GRPO's normaliser there
    loss_ref, _, _ = one_step(ours(tmp_path / "a", loss_type="dgrpo", opd_coef=0.0,
                                   loss_aggregation="global_token_mean"))
    trainer = ours(tmp_path / "b", loss_type="dgrpo", opd_teacher_model=teachers["other"], opd_coef=1.0,
                   loss_aggregation="global_token_mean")
    loss, _, inputs = one_step(trainer)
    mask = inputs["completion_mask"]
    k1 = (trainer._metrics["train"]["groupx/teacher_reverse_kl"][-1]) * mask.sum()
    torch.testing.assert_close(loss - loss_ref, k1 / mask.sum(), atol=1e-5, rtol=1e-4)


def test_construction_errors_name_the_flag(tmp_path, teachers):
    with pytest.raises(ValueError, match="opd_teacher_model is not set"):
        ours(tmp_path / "a", loss_type="dgrpo", opd_coef=1.0)
    with pytest.raises(ValueError, match="opd_teacher_model=.*vocab_size 100 but the student has 104"):
        ours(tmp_path / "b", loss_type="dgrpo", opd_teacher_model=teachers["small_vocab"])
    with pytest.raises(ValueError, match="opd_teacher_model=.*different tokenizer"):
        ours(tmp_path / "c", loss_type="dgrpo", opd_teacher_model=teachers["other_tokenizer"])
    with pytest.raises(ValueError, match="opd_teacher_model=.*no tokenizer|opd_teacher_model=.*could not be loaded"):
        ours(tmp_path / "d", loss_type="dgrpo", opd_teacher_model=str(tmp_path / "missing"))


def test_plain_trl_config_is_untouched(tmp_path):
    trainer = ours(tmp_path, loss_type="grpo")
    assert trainer._teacher is None
    assert "groupx_teacher_logps" not in one_step(trainer)[2]
    assert trl_groupx.get_variant("dgrpo").needs


def test_teacher_logps_follow_their_rows_through_shuffle_and_split(tmp_path, teachers):
    # two micro-batches per generation batch (TRL shuffles the rows, then splits): each micro-batch's teacher
    # log-probs are the teacher's on that micro-batch's own rows; group size 2 (the smallest GRPO group)
    trainer = ours(tmp_path, loss_type="dgrpo", opd_teacher_model=teachers["other"], num_generations=2,
                   per_device_train_batch_size=4, gradient_accumulation_steps=2)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    teacher = AutoModelForCausalLM.from_pretrained(teachers["other"])
    for step in (0, 1):
        trainer._step = step
        inputs = trainer._prepare_inputs(batch)
        t = inputs["completion_ids"].size(1)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            logits = teacher(input_ids=ids, attention_mask=att).logits[:, -t - 1 : -1] / trainer.temperature
        expected = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        mask = inputs["completion_mask"]
        assert mask.sum() > 0
        torch.testing.assert_close(inputs["groupx_teacher_logps"] * mask, expected * mask, atol=1e-5, rtol=1e-5)


def test_evaluation_batches_get_the_term_too(tmp_path, teachers):
    # evaluation generates its own batch (no buffering): the teacher scores it and the reverse KL is logged under eval
    trainer = ours(tmp_path, loss_type="dgrpo", opd_teacher_model=teachers["other"])
    trainer.model.eval()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(batch)
    assert inputs["groupx_teacher_logps"].shape == inputs["completion_ids"].shape
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss)
    assert len(trainer._metrics["eval"]["groupx/teacher_reverse_kl"]) == 1
    assert not trainer._metrics["train"]["groupx/teacher_reverse_kl"]
