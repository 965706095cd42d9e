"""S2L-PO on the tiny model with a local explorer (the tiny model with perturbed weights): on an explorer batch the
completions are the explorer's (the ones a GRPO run of the explorer itself samples) and the gradient is the policy's
GRPO gradient on them (no importance correction), different from plain GRPO; on a learner batch, and with
s2l_po_anneal_steps=0, training is plain GRPO's; full and LoRA; the schedule follows global_step through a resume and
with several optimizer steps per generation batch; evaluation uses the policy; a composition with an objective;
construction errors."""

import pytest
import torch

from tests.conftest import assert_same_weights, base_config_kwargs, grads_differ, one_step
from tests.integration.objective_helpers import current_logps, ours
from tests.integration.test_dgrpo import teachers  # noqa: F401  (fixture: local perturbed / mismatched models)
from trl_groupx import GRPOConfig
from trl_groupx.toy import load_tiny_model, load_tiny_tokenizer, tiny_model_path

PEFT = [False, True]
FLAG = "groupx/s2l_po_explorer_batch"


@pytest.fixture(scope="module")
def wide_vocab_explorer(tmp_path_factory):
    """The tiny model with 4 extra embedding rows and the policy's tokenizer: it could sample ids the policy lacks."""
    path = tmp_path_factory.mktemp("explorers") / "wide_vocab"
    model = load_tiny_model()
    model.resize_token_embeddings(model.config.vocab_size + 4)
    model.save_pretrained(path)
    load_tiny_tokenizer().save_pretrained(path)
    return str(path)


def _s2l(tmp_path, peft, explorer, **flags):
    flags = {"s2l_po_group_sizes": "fixed", **flags}  # TRL's sampler: the same prompts as the runs compared with
    return ours(tmp_path, peft, rollout_filter="s2l_po", s2l_po_explorer_model=explorer, **flags)


def _grads_of_loss(trainer, inputs):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by Trainer.train
    trainer.model.zero_grad(set_to_none=True)
    trainer.compute_loss(trainer.model, inputs).backward()
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("peft", PEFT)
def test_explorer_batch_trains_the_policy_on_the_explorers_completions(tmp_path, teachers, peft):  # noqa: F811
    trainer = _s2l(tmp_path / "s2l", peft, teachers["other"])
    assert trainer.state.global_step == 0  # generation batch 0: an explorer batch of the official N = 8 schedule
    _, grads, inputs = one_step(trainer)
    assert trainer._metrics["train"][FLAG] == [1.0]
    # the completions are those a GRPO run of the explorer itself samples (same prompts, same seed)
    _, _, inputs_explorer = one_step(ours(tmp_path / "explorer", False, model=teachers["other"]))
    assert torch.equal(inputs["completion_ids"], inputs_explorer["completion_ids"])
    torch.testing.assert_close(inputs["advantages"], inputs_explorer["advantages"])  # same rewards, GRPO's groups
    # ... and not the policy's
    _, g_grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft))
    assert not torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])
    assert grads_differ(g_grpo, grads)
    # the loss is plain GRPO's loss of the policy on those rows: no importance correction, no explorer log-probs
    assert inputs.get("old_per_token_logps") is None and "sampling_per_token_logps" not in inputs
    expected = _grads_of_loss(ours(tmp_path / "grpo_on_explorer_rows", peft), inputs)
    assert expected.keys() == grads.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], expected[k], atol=1e-6, rtol=1e-5)


def test_old_logps_of_explorer_rows_are_the_policys(tmp_path, teachers):  # noqa: F811
    # two optimizer steps per generation batch: TRL stores old log-probs, computed by the policy on the explorer's
    # tokens (ratio 1 at the first update, no correction toward the explorer's own log-probs)
    trainer = _s2l(tmp_path, False, teachers["other"], steps_per_generation=2)
    _, _, inputs = one_step(trainer)
    assert trainer._metrics["train"][FLAG] == [1.0]
    old = inputs["old_per_token_logps"]
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(old[mask], current_logps(trainer, inputs)[mask])
    explorer_logps = trainer._get_per_token_logps_and_entropies(
        trainer._explorer, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].size(1))[0]
    assert (old - explorer_logps.detach())[mask].abs().max() > 0.1


@pytest.mark.parametrize("peft", PEFT)
def test_learner_batch_is_plain_grpo(tmp_path, teachers, peft):  # noqa: F811
    trainer = _s2l(tmp_path / "s2l", peft, teachers["other"])
    trainer.state.global_step = 2  # generation batch 2: the first learner batch of N = 8 (explorer 0, 1, 3, ...)
    _, grads, inputs = one_step(trainer)
    assert trainer._metrics["train"][FLAG] == [0.0]
    _, expected, inputs_grpo = one_step(ours(tmp_path / "grpo", peft))
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])
    torch.testing.assert_close(inputs["advantages"], inputs_grpo["advantages"])
    for k in expected:
        torch.testing.assert_close(grads[k], expected[k], atol=1e-7, rtol=0)


def test_zero_anneal_steps_is_plain_grpo_and_loads_no_explorer(tmp_path):
    # frac = 0 throughout: no explorer batch at all, even at step 0; no explorer needed
    trainer = ours(tmp_path / "s2l", rollout_filter="s2l_po", s2l_po_anneal_steps=0, s2l_po_group_sizes="fixed")
    assert trainer._explorer is None
    _, grads, inputs = one_step(trainer)
    _, expected, inputs_grpo = one_step(ours(tmp_path / "grpo"))
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])
    for k in expected:
        torch.testing.assert_close(grads[k], expected[k], atol=1e-7, rtol=0)


def test_explorer_is_frozen_and_the_policy_trains(tmp_path, teachers):  # noqa: F811
    trainer = _s2l(tmp_path, True, teachers["other"], max_steps=2)
    explorer = trainer._explorer
    assert not explorer.training and not any(p.requires_grad for p in explorer.parameters())
    before_explorer = {n: p.detach().clone() for n, p in explorer.named_parameters()}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert all(p.grad is None and torch.equal(before_explorer[n], p) for n, p in explorer.named_parameters())
    assert not explorer.training
    assert trainer.model_wrapped is not explorer  # the policy is back in place after each explorer batch


def _logged_flags(trainer):
    return {h["step"]: h[FLAG] for h in trainer.state.log_history if FLAG in h}


def test_schedule_follows_global_step_through_a_resume(tmp_path, teachers):  # noqa: F811
    # N = 3: explorer shares 1, 1/2, 0 → batches explorer, explorer, learner, learner (then learner only);
    # one generation batch per optimizer step here, so steps 1..4 log 1, 1, 0, 0
    flags = dict(s2l_po_anneal_steps=3, max_steps=4, save_strategy="steps", save_steps=1)
    full = _s2l(tmp_path / "full", True, teachers["other"], **flags)
    full.train()
    assert _logged_flags(full) == {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}
    # resumed after step 1 (nothing saved for the variant): batch 1 is still the explorer's, then the learner's,
    # and the resumed steps train exactly as the uninterrupted run's (its log before step 2 comes from the checkpoint)
    resumed = _s2l(tmp_path / "resumed", True, teachers["other"], **flags)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    assert _logged_flags(resumed) == {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}
    losses = [{h["step"]: h["loss"] for h in t.state.log_history if "loss" in h and h["step"] > 1}
              for t in (full, resumed)]
    assert losses[0] == losses[1] and len(losses[0]) == 3


def test_official_group_sizes_follow_the_anneal_and_resume(tmp_path, teachers):  # noqa: F811
    # N = 3: batches explorer 16, explorer 8, learner 8, learner 16 rollouts per prompt of the official 16; with G = 4
    # groups of 4, 2, 2, 4 (s2l_po.batch_group_size), 8 rows per batch: 2, 4, 4, 2 prompts
    flags = dict(s2l_po_anneal_steps=3, s2l_po_group_sizes="official", max_steps=4, save_strategy="steps",
                 save_steps=1)
    full = _s2l(tmp_path / "full", False, teachers["other"], **flags)
    full.train()
    logs = [h for h in full.state.log_history if "groupx/groups_per_batch" in h]
    assert [h["groupx/group_size_mean"] for h in logs] == [4.0, 2.0, 2.0, 4.0]
    assert [h["groupx/groups_per_batch"] for h in logs] == [2.0, 4.0, 4.0, 2.0]
    assert _logged_flags(full) == {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}
    assert full.variant_state["s2l_po"]["served"] == 12  # prompts walked along the seeded permutation
    resumed = _s2l(tmp_path / "resumed", False, teachers["other"], **flags)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.variant_state["s2l_po"]["served"] == 12
    assert_same_weights(full, resumed)


def test_official_group_sizes_change_the_gradient(tmp_path, teachers):  # noqa: F811
    # a learner batch of groups of 2 (batch 2 of N = 3) against the same batch index with fixed groups of 4
    grads = {}
    for mode in ("fixed", "official"):
        trainer = _s2l(tmp_path / mode, True, teachers["other"], s2l_po_anneal_steps=3, s2l_po_group_sizes=mode)
        trainer.state.global_step = 2
        _, grads[mode], inputs = one_step(trainer)
        assert inputs["completion_ids"].size(0) == 8
    assert grads_differ(grads["fixed"], grads["official"])


def test_several_optimizer_steps_per_generation_batch(tmp_path, teachers):  # noqa: F811
    # steps_per_generation = 2, gradient_accumulation_steps = 1: generation batch k spans optimizer steps 2k, 2k + 1
    # and is generated at the start of step 2k + 1 (1-based); N = 3 → batches 0, 1 explorer, 2 learner
    trainer = _s2l(tmp_path, True, teachers["other"], s2l_po_anneal_steps=3, max_steps=6, steps_per_generation=2)
    trainer.train()
    assert _logged_flags(trainer) == {1: 1.0, 3: 1.0, 5: 0.0}


def test_evaluation_generates_with_the_policy(tmp_path, teachers):  # noqa: F811
    from trl_groupx.toy import arithmetic_dataset

    trainer = _s2l(tmp_path / "s2l", False, teachers["other"], eval_strategy="no", per_device_eval_batch_size=8)
    trainer.eval_dataset = arithmetic_dataset(8, seed=1)
    trainer.model.eval()
    torch.manual_seed(0)
    got = trainer._prepare_inputs(next(iter(trainer.get_eval_dataloader())))
    grpo = ours(tmp_path / "grpo", False, eval_strategy="no", per_device_eval_batch_size=8)
    grpo.eval_dataset = trainer.eval_dataset
    grpo.model.eval()
    torch.manual_seed(0)
    expected = grpo._prepare_inputs(next(iter(grpo.get_eval_dataloader())))
    assert torch.equal(got["completion_ids"], expected["completion_ids"])
    assert FLAG not in trainer._metrics["train"] and FLAG not in trainer._metrics["eval"]


def test_composes_with_an_objective_variant(tmp_path, teachers):  # noqa: F811
    _, base, _ = one_step(ours(tmp_path / "a", True, loss_type="dual_clip"))
    loss, grads, inputs = one_step(_s2l(tmp_path / "b", True, teachers["other"], loss_type="dual_clip"))
    _, _, inputs_explorer = one_step(ours(tmp_path / "explorer", False, model=teachers["other"]))
    assert torch.equal(inputs["completion_ids"], inputs_explorer["completion_ids"]) and torch.isfinite(loss)
    assert grads_differ(base, grads)


def test_explorer_batch_with_micro_group_generation(tmp_path, teachers):  # noqa: F811
    # generation in micro groups of 4 rows: every chunk of an explorer batch is the explorer's
    flags = dict(generation_micro_group_size=4)
    trainer = _s2l(tmp_path / "s2l", False, teachers["other"], **flags)
    _, _, inputs = one_step(trainer)
    _, _, inputs_explorer = one_step(ours(tmp_path / "explorer", False, model=teachers["other"], **flags))
    assert torch.equal(inputs["completion_ids"], inputs_explorer["completion_ids"])
    assert trainer._metrics["train"][FLAG] == [1.0, 1.0]  # one entry per generate call (8 rows, 2 chunks)


def test_construction_errors_name_the_explorer_flag(tmp_path, teachers, wide_vocab_explorer):  # noqa: F811
    with pytest.raises(ValueError, match="s2l_po_explorer_model is not set: pass the model id or local path"):
        ours(tmp_path / "a", True, rollout_filter="s2l_po")
    with pytest.raises(ValueError, match="s2l_po_explorer_model=.*different tokenizer.*explorer of the same model"):
        _s2l(tmp_path / "b", True, teachers["other_tokenizer"])
    with pytest.raises(ValueError, match="s2l_po_explorer_model=.*vocab_size 108 but the policy has 104"):
        _s2l(tmp_path / "c", True, wide_vocab_explorer)
    with pytest.raises(ValueError, match="s2l_po_explorer_model=.*no tokenizer|s2l_po_explorer_model=.*could not be"):
        _s2l(tmp_path / "d", True, str(tmp_path / "missing"))

    def rollout_func(prompts, trainer):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="cannot redirect a rollout_func to the explorer"):
        _s2l(tmp_path / "e", True, tiny_model_path(), rollout_func=rollout_func)
    # a smaller logit table than the policy's is fine: the explorer samples only ids the policy scores
    assert _s2l(tmp_path / "f", True, teachers["small_vocab"])._explorer is not None


def test_config_errors(tmp_path):
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="s2l_po_anneal_steps must be an integer >= 0"):
            GRPOConfig(**base_config_kwargs(tmp_path, rollout_filter="s2l_po", s2l_po_anneal_steps=bad))
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError, match="s2l_po_explorer_model must be a model id or a local path"):
            GRPOConfig(**base_config_kwargs(tmp_path, rollout_filter="s2l_po", s2l_po_explorer_model=bad))
    with pytest.raises(ValueError, match="steps_per_generation × num_iterations .* multiple of"):
        GRPOConfig(**base_config_kwargs(tmp_path, rollout_filter="s2l_po", steps_per_generation=3,
                                        gradient_accumulation_steps=2, per_device_train_batch_size=4))
    with pytest.raises(ValueError, match="s2l_po_anneal_steps"):  # a variant's parameter without the variant
        GRPOConfig(**base_config_kwargs(tmp_path, s2l_po_anneal_steps=4))
