"""Logit averaging (`rollout_filter="logit_avg"`): the mix, its gradient, the mixed log-probs, the keep-all filter and
the config refusals."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.logit_avg import logit_avg, mixed_logits, mixed_token_logps


def test_mix_hand_values():
    # α = 0.25: 0.25·[4, 0] + 0.75·[0, 8] = [1, 6]
    z = mixed_logits(torch.tensor([[4.0, 0.0]]), torch.tensor([[0.0, 8.0]]), 0.25)
    torch.testing.assert_close(z, torch.tensor([[1.0, 6.0]]))


@pytest.mark.parametrize("alpha", [0.5, 0.3, 1.0])
def test_gradient_of_the_mix_is_alpha_and_the_reference_gets_none(alpha):
    policy = torch.randn(2, 3, 5, requires_grad=True)
    reference = torch.randn(2, 3, 5, requires_grad=True)
    z = mixed_logits(policy, reference, alpha)
    weights = torch.randn_like(z)  # any upstream gradient g: dL/dz_θ = α g
    (z * weights).sum().backward()
    torch.testing.assert_close(policy.grad, alpha * weights)
    assert reference.grad is None  # frozen: detached inside the mix


def test_alpha_one_is_the_plain_policy():
    policy, reference = torch.randn(2, 4, 7), torch.randn(2, 4, 7)
    targets = torch.randint(0, 7, (2, 4))
    logps, entropies = mixed_token_logps(policy, reference, targets, alpha=1.0, temperature=0.7, compute_entropy=True)
    plain = (policy / 0.7).log_softmax(-1)
    torch.testing.assert_close(logps, plain.gather(-1, targets[..., None]).squeeze(-1))
    torch.testing.assert_close(entropies, -(plain.exp() * plain).sum(-1))


def test_mixed_log_probs_hand_values():
    # α = ½, T = 2: z_mix = ½[2, 0] + ½[0, 2] = [1, 1] → /2 → [½, ½] → log p = log ½ for both tokens, entropy log 2
    policy, reference = torch.tensor([[[2.0, 0.0]]]), torch.tensor([[[0.0, 2.0]]])
    logps, entropies = mixed_token_logps(policy, reference, torch.tensor([[1]]), alpha=0.5, temperature=2.0,
                                         compute_entropy=True)
    torch.testing.assert_close(logps, torch.tensor([[math.log(0.5)]]))
    torch.testing.assert_close(entropies, torch.tensor([[math.log(2.0)]]))
    # the policy alone would give log softmax([1, 0])[1] = -log(1 + e): the reference moved it
    assert not torch.isclose(logps, torch.tensor([[-math.log(1 + math.e)]])).any()


def test_filter_keeps_every_rollout_and_refuses_inf():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    batch = RolloutBatch(rewards=rewards, completion_lengths=torch.tensor([3, 0, 5, 1]), group_size=2)
    assert logit_avg(batch).tolist() == [True] * 4
    with pytest.raises(ValueError, match="inf"):
        logit_avg(RolloutBatch(rewards=torch.tensor([1.0, float("inf")]), completion_lengths=torch.ones(2),
                               group_size=2))


def _config(tmp_path, **kw):
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", rollout_filter="logit_avg",
                      num_generations=2, per_device_train_batch_size=2, **kw)


def test_config_defaults_are_the_paper(tmp_path):
    config = _config(tmp_path)
    assert config.logit_avg_alpha == 0.5 and config.beta == 0.0


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, float("nan"), True])
def test_bad_alpha_is_refused(tmp_path, alpha):
    with pytest.raises(ValueError, match="logit_avg_alpha"):
        _config(tmp_path, logit_avg_alpha=alpha)


@pytest.mark.parametrize("flags, named", [
    ({"beta": 0.04}, "beta=0"),
    ({"use_vllm": True}, "use_vllm"),
    ({"use_transformers_continuous_batching": True}, "use_transformers_continuous_batching"),
    ({"logps_chunk_size": 8}, "logps_chunk_size"),
])
def test_paths_that_bypass_the_mix_are_refused(tmp_path, flags, named):
    with pytest.raises(ValueError, match=named):
        _config(tmp_path, **flags)


def test_variants_with_their_own_forward_are_refused(tmp_path):
    with pytest.raises(ValueError, match="remax"):
        _config(tmp_path, advantage_estimator="remax")
