"""SPPO on the tiny model with the tiny model as value model (a new scalar head): the trained advantages are
R − σ(V(x)) under the value model before its step, the gradient differs from GRPO's on the same rollouts (full and
LoRA), one rollout per prompt trains, the value model takes its own BCE step and never a policy gradient, its loss
falls over a few updates on a fixed batch, an objective composes, unscored rollouts get 0, rewards outside [0, 1] and
a missing or mismatched value model are refused naming the flag. Resuming exactly: test_stateful_contract.py; two
processes: test_sppo_mp.py."""

import copy
import itertools

import pytest
import torch

from tests.conftest import grads_differ, one_step
from tests.integration.objective_helpers import ours
from tests.integration.test_dgrpo import teachers  # noqa: F401  (fixture: local perturbed / mismatched models)
from trl_groupx.advantages.sppo_value import last_prompt_token_logits
from trl_groupx.toy import arithmetic_dataset, load_tiny_tokenizer, tiny_model_path

PEFT = [False, True]


def sppo(tmp_path, peft=False, **flags):
    return ours(tmp_path, peft, advantage_estimator="sppo", sppo_value_model=tiny_model_path(), **flags)


def rewards_behind(value_model, inputs):
    """R = A + σ(V(x)) for the trained rows, V from a copy of the value model taken before its step."""
    with torch.no_grad():
        v = last_prompt_token_logits(value_model, inputs["prompt_ids"], inputs["prompt_mask"])
    return inputs["advantages"].float() + torch.sigmoid(v)


@pytest.mark.parametrize("peft", PEFT)
def test_advantages_are_reward_minus_value_and_the_gradient_differs_from_grpo(tmp_path, peft):
    _, g_grpo, inputs_grpo = one_step(ours(tmp_path / "grpo", peft))
    trainer = sppo(tmp_path / "sppo", peft)
    before = copy.deepcopy(trainer._sppo_value.model)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], inputs_grpo["completion_ids"])  # the value model draws no RNG
    rewards = rewards_behind(before, inputs)
    torch.testing.assert_close(rewards, rewards.round(), atol=1e-5, rtol=0)  # the parity reward is 0 or 1
    assert {0.0, 1.0} <= set(rewards.round().tolist())
    assert grads_differ(grads, g_grpo)


@pytest.mark.parametrize("peft", PEFT)
def test_one_rollout_per_prompt_trains(tmp_path, peft):
    trainer = sppo(tmp_path, peft, num_generations=1)
    before = copy.deepcopy(trainer._sppo_value.model)
    loss, grads, inputs = one_step(trainer)
    assert inputs["advantages"].numel() == 8 and torch.isfinite(loss)
    rewards = rewards_behind(before, inputs)
    torch.testing.assert_close(rewards, rewards.round(), atol=1e-5, rtol=0)
    assert (inputs["advantages"] != 0).all()  # no group of one collapses to 0: the baseline is σ(V(x)) ∈ (0, 1)
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_value_model_takes_its_own_step_and_never_a_policy_gradient(tmp_path):
    trainer = sppo(tmp_path, sppo_value_lr=1e-3)
    value = trainer._sppo_value.model
    start = {k: v.clone() for k, v in value.state_dict().items()}
    one_step(trainer)  # generation (the value model's BCE step), then the policy loss's backward
    assert all(p.grad is None for p in value.parameters())
    policy = {id(p) for group in trainer.create_optimizer().param_groups for p in group["params"]}
    assert policy and not policy & {id(p) for p in value.parameters()}
    assert not policy & {id(p) for p in trainer._sppo_value.optimizer.param_groups[0]["params"]}
    assert not torch.equal(value.score.weight, start["score.weight"])  # the head moved by the BCE step
    assert trainer._metrics["train"]["groupx/sppo_value_loss"]


def test_value_loss_decreases_on_a_fixed_batch(tmp_path):
    trainer = sppo(tmp_path, sppo_value_lr=1e-3)
    tokenizer = load_tiny_tokenizer()
    tokenizer.padding_side = "left"
    batch = tokenizer(["2+3=", "7+1=", "4+4=", "9+0=", "1+1=", "6+2=", "3+5=", "8+8="], return_tensors="pt",
                      padding=True)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, float("nan")])  # the last one unscored
    value = trainer._sppo_value
    losses = [value.update(batch["input_ids"], batch["attention_mask"], rewards, start=0)["value_loss"]
              for _ in range(6)]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.05, losses


def test_composes_with_an_objective(tmp_path):
    _, g_sppo, _ = one_step(sppo(tmp_path / "sppo"))
    loss, grads, _ = one_step(sppo(tmp_path / "gmpo", loss_type="gmpo"))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    assert grads_differ(grads, g_sppo)


def test_evaluation_leaves_the_value_model_alone(tmp_path):
    trainer = sppo(tmp_path, num_generations=1, per_device_eval_batch_size=8)
    value = trainer._sppo_value
    start = {k: v.clone() for k, v in value.model.state_dict().items()}
    scored, logits = [], value.logits
    value.logits = lambda *a: scored.append(a[0].size(0)) or logits(*a)
    trainer.evaluate(eval_dataset=arithmetic_dataset(8, seed=1))
    assert sum(scored) == 8  # the evaluation prompts got their values (advantages R − σ(V), logged)
    assert all(torch.equal(v, start[k]) for k, v in trainer._sppo_value.model.state_dict().items())
    assert not trainer._metrics["train"]["groupx/sppo_value_loss"]


def _text(c):
    return c[-1]["content"] if isinstance(c, list) else c


def half_unscored(completions, **kwargs):
    return [None if i % 2 else float(ord(_text(c)[-1]) % 2) if _text(c) else 0.0 for i, c in enumerate(completions)]


def test_unscored_rollouts_get_zero_advantage(tmp_path):
    trainer = sppo(tmp_path, reward_funcs=half_unscored, num_generations=1)
    loss, _, _ = one_step(trainer)
    unscored = torch.isnan(trainer._rewards_per_func).all(dim=1)
    logged = torch.tensor(list(trainer._logs["advantages"])[-len(unscored):])
    assert unscored.sum() == 4 and (logged[unscored] == 0).all() and (logged[~unscored] != 0).all()
    assert torch.isfinite(loss)


def test_rewards_outside_the_unit_interval_are_refused(tmp_path):
    def two(completions, **kwargs):
        return [2.0] * len(completions)

    with pytest.raises(ValueError, match=r"sppo.*\[0, 1\]"):
        one_step(sppo(tmp_path, reward_funcs=two))


def test_construction_errors_name_the_flag(tmp_path, teachers):  # noqa: F811
    with pytest.raises(ValueError, match="sppo_value_model is not set"):
        ours(tmp_path / "none", advantage_estimator="sppo")
    with pytest.raises(ValueError, match="sppo_value_model=.*different tokenizer"):
        ours(tmp_path / "tok", advantage_estimator="sppo", sppo_value_model=teachers["other_tokenizer"])
    with pytest.raises(ValueError, match="sppo_value_model=.*vocab_size"):
        ours(tmp_path / "vocab", advantage_estimator="sppo", sppo_value_model=teachers["small_vocab"])
    with pytest.raises(ValueError, match="sppo_value_model="):
        ours(tmp_path / "missing", advantage_estimator="sppo", sppo_value_model=str(tmp_path / "no-such-folder"))
