"""Thinkless / DeGRPO (`loss_type="thinkless"`): hand-derived values and gradients, the official formula on a
fixture, edge cases."""

import math

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, clipped_surrogate, thinkless_surrogate

LN = math.log


def fixture():
    # row 0: A = +1, mask [1, 1, 1], ρ = (1, 1.1, 1.5)
    # row 1: A = -2, mask [1, 1, 0], ρ = (0.5, 0.9, e^7 on padding)
    logps = torch.tensor([[0.0, LN(1.1), LN(1.5)], [LN(0.5), LN(0.9), 7.0]], requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(2, 3), torch.tensor([[1.0], [-2.0]]), torch.tensor([[1.0, 1, 1], [1, 1, 0]]))
    return ctx, logps


def run(ctx, aggregation, alpha=0.5, epsilon_high=None):
    per_token = thinkless_surrogate(ctx, epsilon=0.2, epsilon_high=epsilon_high, thinkless_alpha=alpha,
                                    loss_aggregation=aggregation)
    return per_token, aggregate(per_token, ctx.mask, aggregation or "sequence_mean")


# PPO token losses ℓ = max(-Aρ, -A clip(ρ, .8, 1.2)):
#   row 0: ℓ = (-1, -1.1, max(-1.5, -1.2) = -1.2 clipped);  dℓ/dlogp = -Aρ = (-1, -1.1, 0)
#   row 1: ℓ = (max(1, 1.6) = 1.6 clipped, 1.8, —);         dℓ/dlogp = (0, -Aρ = 1.8, 0)


def test_paper_sequence_form_values_and_gradients():
    # α = 0.5.  Paper: mean_i [α ℓ_i0 + (1/|y_i|) Σ_{t≥1} ℓ_it]
    #   row 0: .5·(-1) + (-1.1 - 1.2)/2 = -1.65;  row 1: .5·1.6 + 1.8/1 = 2.6;  loss = (-1.65 + 2.6)/2 = .475
    # per-token (so that the trainer's sequence mean Σ_t l/n_i gives that): l_i0 = α ℓ_i0 n_i, l_it = ℓ_it n_i/|y_i|
    #   row 0 (n=3, |y|=2): (-1.5, -1.65, -1.8);  row 1 (n=2, |y|=1): (1.6, 3.6, 0)
    # gradient of the loss: control α/G · dℓ, response (1/|y_i|)/G · dℓ
    #   row 0: (.5/2·-1, 1/2/2·-1.1, 0) = (-.25, -.275, 0);  row 1: (0, 1/1/2·1.8, 0) = (0, .9, 0)
    ctx, logps = fixture()
    per_token, loss = run(ctx, None)
    torch.testing.assert_close(per_token, torch.tensor([[-1.5, -1.65, -1.8], [1.6, 3.6, 0.0]]))
    assert loss.item() == pytest.approx(0.475)
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.25, -0.275, 0.0], [0.0, 0.9, 0.0]]))


def test_official_token_form_values_and_gradients():
    # α = 0.5, official: α·masked_mean(ℓ, cond) + masked_mean(ℓ, resp) with C = 2 control tokens, R = 3 response
    #   loss = .5·(-1 + 1.6)/2 + (-1.1 - 1.2 + 1.8)/3 = .15 - 1/6 = -1/60
    # gradient: control α/C · dℓ, response 1/R · dℓ → row 0: (-.25, -1.1/3, 0), row 1: (0, 1.8/3, 0)
    ctx, logps = fixture()
    _, loss = run(ctx, "token_mean")
    assert loss.item() == pytest.approx(-1 / 60, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.25, -1.1 / 3, 0.0], [0.0, 0.6, 0.0]]))


def official_compute_policy_loss(old_log_prob, log_prob, advantages, eos_mask, cliprange, thinkless_alpha):
    """The formula of VainF/Thinkless@aa225d2a…:verl/verl/trainer/ppo/core_algos.py:compute_policy_loss
    (l.168-215), re-derived from reading it (verl_F.masked_mean = (x·m).sum() / m.sum())."""
    def masked_mean(x, m):
        return (x * m).sum() / m.sum()

    ratio = torch.exp(log_prob - old_log_prob)
    token_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange))
    cond_mask = eos_mask.clone()
    cond_mask[:, 1:] = 0
    resp_mask = eos_mask.clone()
    resp_mask[:, 0] = 0
    return thinkless_alpha * masked_mean(token_loss, cond_mask) + masked_mean(token_loss, resp_mask)


def test_matches_the_official_code_on_a_random_fixture():
    # verl broadcasts the sequence advantage to (B, T) (times eos_mask); left-aligned masks of random lengths
    torch.manual_seed(0)
    b, t = 6, 9
    lengths = torch.tensor([9, 1, 4, 7, 2, 5])
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    old = -torch.rand(b, t) * 3
    new = (old + 0.3 * torch.randn(b, t)).requires_grad_()
    adv = torch.randn(b, 1)
    official = official_compute_policy_loss(old, new, adv * mask, mask, 0.2, 0.001)
    (g_official,) = torch.autograd.grad(official, new)
    ctx = ObjectiveContext(new, old, adv, mask)
    _, ours = run(ctx, "token_mean", alpha=0.001)
    (g_ours,) = torch.autograd.grad(ours, new)
    torch.testing.assert_close(ours, official)
    torch.testing.assert_close(g_ours, g_official)


def test_alpha_zero_is_grpo_on_the_response_tokens():
    torch.manual_seed(1)
    mask = torch.ones(4, 6)
    mask[2, 3:] = 0
    ctx = ObjectiveContext((-torch.rand(4, 6)).requires_grad_(), -torch.rand(4, 6), torch.randn(4, 1), mask)
    response = mask.clone()
    response[:, 0] = 0
    grpo = aggregate(clipped_surrogate(ctx, epsilon=0.2, epsilon_high=0.28, delta=None,
                                       importance_sampling_level="token"), response, "sequence_mean")
    _, ours = run(ctx, "sequence_mean", alpha=0.0, epsilon_high=0.28)
    torch.testing.assert_close(ours, grpo)
    bnpo = aggregate(clipped_surrogate(ctx, epsilon=0.2, epsilon_high=0.28, delta=None,
                                       importance_sampling_level="token"), response, "token_mean")
    torch.testing.assert_close(run(ctx, "token_mean", alpha=0.0, epsilon_high=0.28)[1], bnpo)


def test_control_weight_is_alpha_per_sequence():
    # catalog check: the control token weighs α per sequence, each response token 1/|y_i| — d loss / d ℓ on policy
    # (ρ = 1, A = -1 so dℓ/dlogp = 1): row lengths 5 and 2 → control α/G, response 1/(|y_i| G)
    mask = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    logps = torch.zeros(2, 5, requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(2, 5), -torch.ones(2, 1), mask)
    run(ctx, None, alpha=0.001)[1].backward()
    expected = torch.tensor([[0.001 / 2, 1 / 8, 1 / 8, 1 / 8, 1 / 8], [0.001 / 2, 1 / 2, 0, 0, 0]])
    torch.testing.assert_close(logps.grad, expected)


def test_edge_rows_empty_control_only_and_masked_control():
    # row 0 empty, row 1 only the control token, row 2 position 0 masked (response only), row 3 padding log-ratio 80
    mask = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 1], [1, 1, 0]])
    logps = torch.tensor([[50.0, 50.0, 50.0], [0.0, 90.0, 90.0], [0.0, 0.0, 0.0], [0.0, 0.0, 80.0]], requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(4, 3), -torch.ones(4, 1), mask)  # A = -1: ℓ = ρ = 1 on policy
    for aggregation in ("sequence_mean", "token_mean"):
        logps.grad = None
        per_token, loss = run(ctx, aggregation, alpha=0.5)
        assert torch.isfinite(per_token).all() and (per_token[mask == 0] == 0).all()
        loss.backward()
        assert torch.isfinite(logps.grad).all() and (logps.grad[mask == 0] == 0).all()
        if aggregation == "sequence_mean":
            # rows: 0 → 0; 1 → α·1 = .5; 2 → (1 + 1)/2 = 1; 3 → .5 + 1 = 1.5; mean over 4 rows = .75
            assert loss.item() == pytest.approx(0.75)
        else:
            # C = 2 (rows 1, 3), R = 3 (row 2 twice, row 3 once): .5·(1 + 1)/2 + 3/3 = 1.5
            assert loss.item() == pytest.approx(1.5)
    # a micro-batch with no token at all: 0, not 0/0
    empty = ObjectiveContext(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3), torch.ones(2, 1), torch.zeros(2, 3))
    for aggregation in ("sequence_mean", "token_mean"):
        assert run(empty, aggregation)[1].item() == 0.0


def test_token_advantages_are_used_per_token():
    mask = torch.ones(1, 3)
    logps = torch.zeros(1, 3, requires_grad=True)
    ctx = ObjectiveContext(logps, torch.zeros(1, 3), torch.tensor([[2.0, -1.0, 3.0]]), mask)
    per_token, loss = run(ctx, None, alpha=1.0)
    # ℓ = -A on policy: (-2, 1, -3); n = 3, |y| = 2 → l = (-2·3, 1·1.5, -3·1.5); loss = -2 + (1 - 3)/2 = -3
    torch.testing.assert_close(per_token, torch.tensor([[-6.0, 1.5, -4.5]]))
    assert loss.item() == pytest.approx(-3.0)


def test_registration_and_validation():
    v = get_variant("thinkless")
    assert v.stage == "objective" and v.flags["thinkless_alpha"] == 0.001 and v.flags["scale_rewards"] == "none"
    assert "thinkless_alpha" in v.params
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **v.flags)
    GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **{**v.flags, "loss_aggregation": "token_mean"})
    with pytest.raises(ValueError, match="thinkless_alpha"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **{**v.flags, "thinkless_alpha": -1.0})
    with pytest.raises(ValueError, match="thinkless_alpha"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **{**v.flags, "thinkless_alpha": float("nan")})
    with pytest.raises(ValueError, match="loss_aggregation"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, **{**v.flags, "loss_aggregation": "constant"})
