"""`frozen_policy_copy` on the tiny model with TRL's fused LM head, as `GRPOTrainer` patches the policy: the copy's
outputs are its own weights' (unchanged when the policy's weights move), its forward never runs a policy module, no
gradient reaches the policy through it, and a fused head added to the copy scores with the copy. The last test pins
the TRL behaviour that makes the helper necessary: a plain `copy.deepcopy` still runs the policy."""

import copy

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from trl_groupx._frozen_copy import frozen_policy_copy
from trl_groupx.toy import load_tiny_model

INPUT_IDS = torch.tensor([[5, 17, 23, 9, 31, 2]])


@pytest.fixture
def policy():
    torch.manual_seed(0)
    model = load_tiny_model()
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))  # as GRPOTrainer does
    return model


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def _policy_module_calls(policy):
    """A list that gets one entry per call of any submodule of `policy` (hooks on the policy's own modules)."""
    calls = []
    for name, module in policy.named_modules():
        if name:
            module.register_forward_pre_hook(lambda m, args, name=name: calls.append(name))
    return calls


def test_copy_outputs_do_not_move_with_the_policy(policy):
    frozen = frozen_policy_copy(policy)
    with torch.no_grad():
        before = frozen(input_ids=INPUT_IDS).logits.clone()
        policy_before = policy(input_ids=INPUT_IDS).logits.clone()
        _perturb(policy)
        after = frozen(input_ids=INPUT_IDS).logits
        policy_after = policy(input_ids=INPUT_IDS).logits
    assert not torch.allclose(policy_before, policy_after)  # the perturbation does move the policy
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_copy_forward_never_runs_a_policy_module(policy):
    frozen = frozen_policy_copy(policy)
    calls = _policy_module_calls(policy)
    with torch.no_grad():
        frozen(input_ids=INPUT_IDS)
        frozen.generate(input_ids=INPUT_IDS, max_new_tokens=3, do_sample=False)
    assert calls == []
    with torch.no_grad():
        policy(input_ids=INPUT_IDS)
    assert calls  # the hooks do fire when the policy runs


def test_copy_is_frozen_and_detached(policy):
    policy.train()
    frozen = frozen_policy_copy(policy)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert all(p.requires_grad for p in policy.parameters())  # the policy stays trainable
    assert frozen.training  # the mode is the caller's to set
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(frozen.parameters(), policy.parameters()))
    with torch.enable_grad():
        logits = frozen(input_ids=INPUT_IDS).logits
    assert not logits.requires_grad  # no graph into the policy's parameters


def test_fused_head_added_to_the_copy_scores_with_the_copy(policy):
    frozen = frozen_policy_copy(policy)
    add_fused_lm_head(frozen, temperature=0.7, outputs=("log_probs", "entropy"))  # as LSPO's scaffold does
    with torch.no_grad():
        # log_softmax(z / T) at the next tokens, from the copy's logits while it still equals the policy
        plain = torch.log_softmax(frozen(input_ids=INPUT_IDS).logits[:, :-1] / 0.7, -1)
        expected = plain.gather(-1, INPUT_IDS[:, 1:, None]).squeeze(-1)
        _perturb(policy)
        fused = frozen(input_ids=INPUT_IDS, labels=INPUT_IDS, fused_lm_head=True).log_probs
        plain_after = frozen(input_ids=INPUT_IDS).logits  # the unfused path of the re-patched forward
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.log_softmax(plain_after[:, :-1] / 0.7, -1), plain, rtol=0, atol=0)


def test_plain_deepcopy_still_runs_the_policy(policy):
    """TRL 1.16's fused-head forward keeps the policy's original forward in its closure: a deep copy's plain forward
    runs the policy's modules and moves with its weights. If this starts failing, TRL changed how it patches the
    forward; `frozen_policy_copy` should then be checked against the new patch."""
    naive = copy.deepcopy(policy).requires_grad_(False)
    calls = _policy_module_calls(policy)
    with torch.no_grad():
        before = naive(input_ids=INPUT_IDS).logits.clone()
        assert calls
        _perturb(policy)
        after = naive(input_ids=INPUT_IDS).logits
    assert not torch.allclose(before, after)
