"""SPPO: A = R − σ(V(x)) on hand-derived numbers and the official code's formula; the value model's BCE update (its
gradient direction, NaN rows left out, mini-batches, the loss it reports); the value at the last prompt token with
padding never read; the config's refusals and its one exception to TRL's group-size minimum."""

import contextlib
import math
import types

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.advantages.sppo import sppo_advantages
from trl_groupx.advantages.sppo_value import PromptValueModel, last_prompt_token_logits

NAN, INF = float("nan"), float("inf")


def sppo(rewards, logits, g=1):
    return sppo_advantages(torch.tensor(rewards), g, prompt_value_logits=torch.tensor(logits))


def test_registered_with_the_official_defaults():
    v = get_variant("sppo")
    assert v.stage == "advantages" and v.requires == ("prompt_value_logits",) and not v.stateful
    assert v.flags["num_generations"] == 1 and v.flags["sppo_value_lr"] == 5e-6  # official n = 1, critic lr 5e-6
    assert set(v.params) == {"sppo_value_model", "sppo_value_lr", "sppo_value_mini_batch_size"}


def test_advantage_is_reward_minus_sigmoid_value():
    # σ(0) = 1/2, σ(ln 3) = 3/4, σ(−ln 3) = 1/4, σ(2) = 1/(1 + e^−2) = 0.8807971
    out = sppo([1.0, 0.0, 1.0, 0.5], [0.0, math.log(3), -math.log(3), 2.0])
    expected = torch.tensor([1 - 0.5, 0 - 0.75, 1 - 0.25, 0.5 - 1 / (1 + math.exp(-2))])
    torch.testing.assert_close(out, expected)


def test_official_formula_on_token_level_rewards():
    """sustech-nlp/SPPO core_algos.py l.757-774: R = token_level_rewards.sum(-1) (the score sits on the last
    response token), advantages = (R − sigmoid(values)).unsqueeze(-1) * response_mask."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    token_rewards = torch.zeros(3, 4)
    token_rewards[0, 2], token_rewards[2, 3] = 1.0, 1.0  # rollout 1 scored 0
    values = torch.tensor([0.3, -1.2, 2.5])
    official = (token_rewards.sum(-1) - torch.sigmoid(values)).unsqueeze(-1) * mask
    ours = sppo_advantages(token_rewards.sum(-1), 1, prompt_value_logits=values)
    torch.testing.assert_close(ours.unsqueeze(-1) * mask, official)


def test_no_group_statistic_so_group_size_is_only_layout():
    rewards, logits = [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, math.log(3), math.log(3)]
    # an all-equal group still gets R − σ(V) = 1/2, 1/2, 1/4, 1/4 (no centring: the value is the baseline)
    for g in (1, 2, 4):
        torch.testing.assert_close(sppo(rewards, logits, g), torch.tensor([0.5, 0.5, 0.25, 0.25]))


def test_nan_rewards_get_zero_advantage():
    out = sppo([NAN, 1.0, NAN, 0.0], [5.0, 0.0, -5.0, 0.0], g=2)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.5, 0.0, -0.5]))


@pytest.mark.parametrize("bad", [1.5, -0.1, INF, -INF, 2.0])
def test_rewards_outside_the_unit_interval_are_refused(bad):
    with pytest.raises(ValueError, match=r"sppo.*binary cross-entropy.*\[0, 1\]"):
        sppo([0.0, bad], [0.0, 0.0])


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="prompt values for 2 rewards"):
        sppo([0.0, 1.0], [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite logits"):
        sppo([0.0, 1.0], [0.0, NAN])


# ---- the value model's update --------------------------------------------------------------------------------------


class _BiasValue(torch.nn.Module):
    """A value model whose logit is one learned scalar b for every prompt (the head of a toy critic)."""

    def __init__(self, b: float = 0.0):
        super().__init__()
        self.b = torch.nn.Parameter(torch.tensor(b))

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False):
        logits = self.b + 0.0 * input_ids.float()
        return types.SimpleNamespace(logits=logits.unsqueeze(-1))


_ONE_PROCESS = types.SimpleNamespace(num_processes=1, autocast=contextlib.nullcontext)


def _value(b=0.0, lr=0.1, mini_batch_size=None, micro=2):
    return PromptValueModel(_BiasValue(b), {}, lr=lr, mini_batch_size=mini_batch_size, micro_batch_size=micro,
                            accelerator=_ONE_PROCESS)


def _prompts(n):
    return torch.ones(n, 3, dtype=torch.long), torch.ones(n, 3, dtype=torch.long)


@pytest.mark.parametrize("target, direction", [(1.0, 1.0), (0.0, -1.0)])
def test_bce_step_moves_the_value_toward_the_reward(target, direction):
    # d BCE(b, R)/db = σ(b) − R = 1/2 − R at b = 0: negative for R = 1 (b goes up), positive for R = 0.
    # AdamW's first step is lr · g/(|g| + 1e-8) = lr · sign(g) (weight decay × b = 0 at b = 0): |Δb| = lr.
    value = _value(lr=0.1)
    stats = value.update(*_prompts(4), torch.full((4,), target), start=0)
    assert value.model.b.item() == pytest.approx(direction * 0.1, rel=1e-6)
    assert stats["value_loss"] == pytest.approx(math.log(2))  # BCE(0, R) = ln 2 for R in {0, 1}, before the step
    assert stats["value_prob_mean"] == pytest.approx(0.5) and stats["value_steps"] == 1


def test_bce_gradient_is_sigmoid_minus_reward_averaged_over_scored_rows():
    value = _value(b=math.log(3))  # σ(b) = 3/4
    rewards = torch.tensor([1.0, NAN, 0.0, 1.0])
    grads = []
    value.optimizer.step = lambda: grads.append(value.model.b.grad.clone())  # the gradient the step would use
    value.update(*_prompts(4), rewards, start=0)
    # mean over the 3 scored rows of (3/4 − R): (−1/4 + 3/4 − 1/4)/3 = 1/12; the NaN row is not read
    assert len(grads) == 1 and grads[0].item() == pytest.approx(1 / 12, rel=1e-5)


def test_nan_rows_do_not_change_the_update():
    with_nan, without = _value(b=0.4), _value(b=0.4)
    with_nan.update(*_prompts(4), torch.tensor([1.0, NAN, 0.0, NAN]), start=0)
    without.update(*_prompts(2), torch.tensor([1.0, 0.0]), start=0)
    assert with_nan.model.b.item() == without.model.b.item()


def test_mini_batches_take_one_step_each_and_skip_unscored_ones():
    value = _value(mini_batch_size=2)
    assert value.update(*_prompts(6), torch.tensor([1.0, 0.0, NAN, NAN, 1.0, 1.0]), start=0)["value_steps"] == 2
    assert value.update(*_prompts(6), torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0]), start=0)["value_steps"] == 3


def test_update_refuses_rewards_outside_the_unit_interval():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _value().update(*_prompts(2), torch.tensor([0.0, 3.0]), start=0)


def test_state_points_at_the_live_weights_and_restores_a_checkpoint():
    value = _value(lr=0.1)
    value.update(*_prompts(2), torch.tensor([1.0, 1.0]), start=0)
    saved = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in value.state["model"].items()}
    assert torch.equal(value.state["model"]["b"], value.model.b.detach())  # a save now sees the updated weights
    optimizer_saved = value.optimizer.state_dict()
    value.update(*_prompts(2), torch.tensor([1.0, 1.0]), start=0)
    value.state.clear()
    value.state.update({"model": saved, "optimizer": optimizer_saved})  # what the trainer does on resume
    value.sync()
    assert value.model.b.item() == pytest.approx(saved["b"].item())


# ---- the value at the last prompt token --------------------------------------------------------------------------


def test_value_reads_the_last_prompt_token_and_never_the_padding():
    from transformers import AutoConfig, AutoModelForTokenClassification

    from trl_groupx.toy import tiny_model_path

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny_model_path(), num_labels=1)
    model = AutoModelForTokenClassification.from_pretrained(tiny_model_path(), config=config).eval()
    ids = torch.tensor([[5, 9, 11, 7]])
    left = torch.tensor([[0, 0, 5, 9, 11, 7]]), torch.tensor([[0, 0, 1, 1, 1, 1]])
    right = torch.tensor([[5, 9, 11, 7, 0, 0]]), torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        plain = last_prompt_token_logits(model, ids, torch.ones_like(ids))
        expected = model(input_ids=ids).logits[0, -1, 0]
        torch.testing.assert_close(plain[0], expected)
        torch.testing.assert_close(last_prompt_token_logits(model, *left), plain, atol=1e-5, rtol=0)
        torch.testing.assert_close(last_prompt_token_logits(model, *right), plain, atol=1e-5, rtol=0)
        # a different last token changes the value: the head reads that position
        other = last_prompt_token_logits(model, torch.tensor([[5, 9, 11, 8]]), torch.ones_like(ids))
        assert not torch.allclose(other, plain)


# ---- config -------------------------------------------------------------------------------------------------------

BASE = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "per_device_train_batch_size": 8}


def test_one_rollout_per_prompt_is_allowed_for_sppo_only():
    config = GRPOConfig(**BASE, advantage_estimator="sppo", num_generations=1)
    assert config.num_generations == 1 and type(config.num_generations) is int
    with pytest.raises(ValueError, match="at least 2 generations per prompt"):
        GRPOConfig(**BASE, num_generations=1)
    with pytest.raises(ValueError, match="at least 2 generations per prompt"):
        GRPOConfig(**BASE, advantage_estimator="rloo", num_generations=1)
    assert GRPOConfig(**BASE, advantage_estimator="sppo", num_generations=4).num_generations == 4


@pytest.mark.parametrize("lr", [0, -1e-6, NAN, INF, True, "5e-6"])
def test_bad_value_lr_is_refused(lr):
    with pytest.raises(ValueError, match="sppo_value_lr must be a finite number > 0"):
        GRPOConfig(**BASE, advantage_estimator="sppo", num_generations=1, sppo_value_lr=lr)


@pytest.mark.parametrize("size", [0, -2, 1.5, True])
def test_bad_value_mini_batch_is_refused(size):
    with pytest.raises(ValueError, match="sppo_value_mini_batch_size must be None"):
        GRPOConfig(**BASE, advantage_estimator="sppo", num_generations=1, sppo_value_mini_batch_size=size)


@pytest.mark.parametrize("path", ["", "   ", 3])
def test_bad_value_model_is_refused(path):
    with pytest.raises(ValueError, match="sppo_value_model must be a model id or a local path"):
        GRPOConfig(**BASE, advantage_estimator="sppo", num_generations=1, sppo_value_model=path)


def test_value_flags_need_sppo():
    with pytest.raises(ValueError, match="sppo_value_lr=0.001 belongs to variant 'sppo'"):
        GRPOConfig(**BASE, num_generations=2, sppo_value_lr=1e-3)
