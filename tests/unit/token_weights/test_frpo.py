"""FRPO future-KL correction on hand-derived tensors."""

import pytest
import torch

from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights.frpo import frpo_token_advantages

NAN = float("nan")


def run(adv, logps, ref, mask, rewards=None, beta=1.0):
    ctx = TokenContext(torch.tensor(mask), 1, logps=torch.tensor(logps), ref_logps=torch.tensor(ref),
                       rewards=None if rewards is None else torch.tensor(rewards))
    return frpo_token_advantages(torch.tensor(adv), ctx, frpo_beta=beta)


def test_catalog_check():
    # log-ratios [0.1, 0.2, 0.3], β = 1: return-to-go [0.6, 0.5, 0.3] → A − [0.6, 0.5, 0.3]
    out = run([1.0], [[0.1, 0.2, 0.3]], [[0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0]])
    torch.testing.assert_close(out, torch.tensor([[0.4, 0.5, 0.7]]))


def test_zero_log_ratios_give_grpo_advantages_and_beta_scales():
    out = run([0.5, -1.0], [[-1.0, -2.0], [-0.5, -0.5]], [[-1.0, -2.0], [-0.5, -0.5]], [[1.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.5], [-1.0, -1.0]]))
    out = run([0.0], [[0.2, -0.1]], [[0.0, 0.0]], [[1.0, 1.0]], beta=0.01)  # 0.01 · [0.1, -0.1]
    torch.testing.assert_close(out, torch.tensor([[-0.001, 0.001]]))


def test_padding_never_enters_the_sum():
    # the padded position holds a huge log-ratio that must not reach the return-to-go
    out = run([0.0], [[0.1, 0.2, 50.0]], [[0.0, 0.0, -50.0]], [[1.0, 1.0, 0.0]])
    torch.testing.assert_close(out, torch.tensor([[-0.3, -0.2, 0.0]]))


def test_unscored_rollout_and_empty_completion():
    out = run([NAN, 1.0], [[0.1, 0.1], [0.1, 0.1]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]],
              rewards=[NAN, 1.0])
    assert (out == 0).all()


def test_inf_reward_and_missing_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="token_weighting='frpo'"):
        run([1.0], [[0.0]], [[0.0]], [[1.0]], rewards=[float("inf")])
    ctx = TokenContext(torch.ones(1, 1), 1, logps=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="reference log-probs"):
        frpo_token_advantages(torch.zeros(1), ctx, frpo_beta=0.01)


def test_negative_beta_rejected_at_config():
    from trl_groupx import GRPOConfig

    with pytest.raises(ValueError, match="frpo_beta must be >= 0"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, token_weighting="frpo", frpo_beta=-1.0)
