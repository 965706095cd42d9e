"""ReMax and AAPO on the tiny model: the trainer generates the extra baseline completions (greedy for ReMax, one
reference sample per rollout for AAPO), scores them with the run's reward function, and trains on exactly
`A = r − r_greedy` / `Â + clip(r − r_ref)`; the update differs from plain GRPO; bad setups fail at construction."""

import json
import re
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.advantages import aapo_advantages, remax_advantages

QUESTION = re.compile(r"\d+\+\d+=")  # the arithmetic prompts' question


class RecordingReward:
    """parity_reward that remembers each call's (prompts, completions, rewards), in call order."""

    __name__ = "parity_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = parity_reward(completions)
        self.calls.append((prompts, completions, rewards))
        return rewards


def ours(tmp_path, peft=False, reward=None, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=reward or parity_reward, **flags)


def _text(prompt):
    return prompt[-1]["content"]


def _pairs(trainer, inputs):
    """(prompt text, advantage) of the rows the loss sees (TRL shuffles rows after scoring)."""
    prompts = trainer.processing_class.batch_decode(inputs["prompt_ids"], skip_special_tokens=True)
    return sorted((QUESTION.search(p).group(), round(a, 5)) for p, a in zip(prompts, inputs["advantages"].tolist()))


def _expected_pairs(prompts, advantages):
    return sorted((QUESTION.search(_text(p)).group(), round(a, 5)) for p, a in zip(prompts, advantages.tolist()))


@pytest.mark.parametrize("peft", [False, True])
def test_remax_trains_on_reward_minus_greedy_reward(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    reward = RecordingReward()
    trainer = ours(tmp_path / "remax", peft, reward=reward, advantage_estimator="remax")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same sampled batch
    (prompts, _, rewards), (greedy_prompts, greedy_completions, greedy_rewards) = reward.calls
    # one greedy completion per prompt (8 rollouts = 2 groups of 4)
    assert [_text(p) for p in greedy_prompts] == [_text(prompts[0]), _text(prompts[4])]
    baseline = torch.tensor(greedy_rewards).repeat_interleave(4)
    expected = remax_advantages(torch.tensor(rewards), 4, greedy_baseline_rewards=baseline)
    assert _pairs(trainer, inputs) == _expected_pairs(prompts, expected)
    assert grads_differ(base_grads, grads)
    # greedy means argmax: each generated token is the model's argmax after the prompt and the tokens before it
    model = trainer.accelerator.unwrap_model(trainer.model)
    tok = trainer.processing_class
    for prompt, completion in zip(greedy_prompts, greedy_completions):
        prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids = tok(completion[0]["content"], add_special_tokens=False)["input_ids"]
        full = torch.tensor([list(prompt_ids) + ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt_ids) - 1 : -1]
        assert logits.argmax(-1).tolist() == ids


def test_aapo_lora_samples_the_base_model_and_adds_the_clipped_margin(tmp_path):
    _, base_grads, _ = one_step(ours(tmp_path / "base", True))
    reward = RecordingReward()
    trainer = ours(tmp_path / "aapo", True, reward=reward, advantage_estimator="aapo", loss_type="gpg")
    disabled = []
    model = trainer.accelerator.unwrap_model(trainer.model)
    real = model.disable_adapter

    def spy():  # the reference sample is drawn with the LoRA adapter switched off
        disabled.append(True)
        return real()

    model.disable_adapter = spy
    _, grads, inputs = one_step(trainer)
    (prompts, _, rewards), (ref_prompts, _, ref_rewards) = reward.calls
    assert [_text(p) for p in ref_prompts] == [_text(p) for p in prompts]  # one reference sample per rollout
    assert disabled
    expected = aapo_advantages(torch.tensor(rewards), 4, reference_sample_rewards=torch.tensor(ref_rewards))
    assert _pairs(trainer, inputs) == _expected_pairs(prompts, expected)
    assert grads_differ(base_grads, grads)


def test_aapo_full_finetuning_uses_trls_ref_model(tmp_path):
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, advantage_estimator="aapo", beta=0.04)
    assert trainer.ref_model is not None
    used = []
    real = trainer.ref_model.forward

    def spy(*args, **kwargs):
        used.append(True)
        return real(*args, **kwargs)

    trainer.ref_model.forward = spy
    _, grads, inputs = one_step(trainer)
    assert used and len(reward.calls) == 2 and len(reward.calls[1][0]) == 8
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_remax_composes_with_gmpo(tmp_path):
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, advantage_estimator="remax", loss_type="gmpo")
    _, grads, inputs = one_step(trainer)
    (prompts, _, rewards), (_, _, greedy_rewards) = reward.calls
    expected = remax_advantages(torch.tensor(rewards), 4,
                                greedy_baseline_rewards=torch.tensor(greedy_rewards).repeat_interleave(4))
    assert _pairs(trainer, inputs) == _expected_pairs(prompts, expected)
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_aapo_without_a_reference_model_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="advantage_estimator='aapo'.*LoRA adapter.*beta > 0"):
        ours(tmp_path, advantage_estimator="aapo")  # full fine-tuning, beta = 0: no reference


def test_remax_with_a_rollout_func_fails_at_construction(tmp_path):
    def rollout_func(prompts, trainer):  # never called
        raise AssertionError

    with pytest.raises(ValueError, match="advantage_estimator='remax'.*rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, advantage_estimator="remax",
                      rollout_func=rollout_func)


def test_generation_config_is_restored_after_the_greedy_pass(tmp_path):
    trainer = ours(tmp_path, advantage_estimator="remax")
    before = trainer.generation_config
    one_step(trainer)
    assert trainer.generation_config is before and before.do_sample


@needs_torchrun
def test_two_processes_share_the_split_groups_baseline(tmp_path):
    launch(Path(__file__).with_name("baseline_rollouts_mp_worker.py"), tmp_path)
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["matches_formula"] and r["baseline_prompts_ok"], r


def test_scoring_the_baseline_leaves_the_batch_logs_alone(tmp_path):
    """A reward that logs a completions-table column and a metric: the greedy baselines' calls leave nothing behind
    (else the next batch's table would get extra, misaligned rows)."""

    def logging_reward(completions, log_extra, log_metric, **kwargs):
        rewards = parity_reward(completions)
        log_extra("parity", rewards)
        log_metric("parity_calls", 1.0)
        return rewards

    trainer = ours(tmp_path, reward=logging_reward, advantage_estimator="remax")
    one_step(trainer)
    assert len(trainer._logs["extra"]["parity"]) == 8  # the rollouts' values only
    assert not trainer._pending_extra_logs and not trainer._pending_metrics
