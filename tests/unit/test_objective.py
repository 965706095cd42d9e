"""Objective-stage surrogates and aggregation on hand-computed tensors, values and gradients."""

import math

import pytest
import torch

from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, cispo_surrogate, clipped_surrogate, gmpo_surrogate, sapo_surrogate


def ctx_of(logps, old, adv, mask):
    logps = torch.tensor(logps, requires_grad=True)
    return ObjectiveContext(logps, torch.tensor(old), torch.tensor(adv).view(-1, 1), torch.tensor(mask)), logps


class TestGMPO:
    # Fixture built by reading callsys/GMPO@205b2bf:train_zero_math_gmpo.py l.675-701 (and verl's geo_mean).
    LOGPS = [[-1.0, -0.5, -2.0], [-0.3, -2.5, -7.0]]
    OLD = [[-1.5, -0.6, -1.9], [-0.9, -1.9, -1.0]]
    MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    ADV = [1.2, -0.8]

    def test_official_fixture_loss_and_gradient(self):
        # seq 0 (A>0): d=[.5,.1,-.1] → min(d,.4)=[.4,.1,-.1], mean .4/3 → ℓ0 = -1.2·e^{0.13333} = -1.371157
        # seq 1 (A<0): d=[.6,-.6] → max(d,-.4)=[.6,-.4], mean .1 → ℓ1 = 0.8·e^{0.1} = 0.884137
        ctx, logps = ctx_of(self.LOGPS, self.OLD, self.ADV, self.MASK)
        per_token = gmpo_surrogate(ctx, gmpo_clip=0.4)
        assert per_token.shape == (2, 3)
        torch.testing.assert_close(per_token[:, 0], torch.tensor([-1.2 * math.exp(0.4 / 3), 0.8 * math.exp(0.1)]))
        loss = aggregate(per_token, ctx.mask, "sequence_mean")
        assert loss.item() == pytest.approx(-0.243510, abs=1e-6)
        loss.backward()
        # dL/dlogp = -(A_i/N)·ratio_i/|o_i| on unclipped valid tokens, 0 on clipped tokens and padding
        g0 = -(1.2 / 2) * math.exp(0.4 / 3) / 3
        g1 = (0.8 / 2) * math.exp(0.1) / 2
        torch.testing.assert_close(logps.grad, torch.tensor([[0.0, g0, g0], [g1, 0.0, 0.0]]))
        assert g0 == pytest.approx(-0.228526, abs=1e-6) and g1 == pytest.approx(0.221034, abs=1e-6)

    def test_equal_ratios_match_grpo(self):
        # all token ratios equal c (unclipped) → geometric mean = arithmetic mean = c
        c = math.log(1.1)
        ctx, _ = ctx_of([[c, c, c]], [[0.0, 0.0, 0.0]], [0.7], [[1.0, 1.0, 1.0]])
        gmpo = aggregate(gmpo_surrogate(ctx, gmpo_clip=0.4), ctx.mask, "sequence_mean")
        grpo = aggregate(
            clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token"),
            ctx.mask,
            "sequence_mean",
        )
        torch.testing.assert_close(gmpo, grpo)

    def test_outlier_ratio_moves_objective_by_its_t_th_root(self):
        # one ratio of 10 among T=4 tokens (no clip): GMPO ratio 10^{1/4}; GRPO's arithmetic mean (10+3)/4
        t = 4
        ctx, _ = ctx_of([[math.log(10.0), 0, 0, 0]], [[0.0] * t], [1.0], [[1.0] * t])
        loss = gmpo_surrogate(ctx, gmpo_clip=100.0)[0, 0]
        assert loss.item() == pytest.approx(-(10 ** (1 / t)))

    def test_zero_advantage_and_empty_completion(self):
        ctx, logps = ctx_of([[0.3, 0.1], [0.2, 0.2]], [[0.0, 0.0], [0.0, 0.0]], [0.0, 1.0], [[1.0, 1.0], [0.0, 0.0]])
        per_token = gmpo_surrogate(ctx, gmpo_clip=0.4)
        assert torch.isfinite(per_token).all()
        assert per_token[0].abs().max() == 0  # A = 0 → no loss
        assert per_token[1, 0].item() == pytest.approx(-1.0)  # empty completion: mean log-ratio taken as 0
        aggregate(per_token, ctx.mask, "sequence_mean").backward()
        assert logps.grad[1].abs().max() == 0  # and it carries no gradient

    def test_token_advantages_are_averaged(self):
        ctx, _ = ctx_of([[0.0, 0.0]], [[0.0, 0.0]], [0.0], [[1.0, 1.0]])
        ctx.advantages = torch.tensor([[1.0, 3.0]])
        assert gmpo_surrogate(ctx, gmpo_clip=0.4)[0, 0].item() == pytest.approx(-2.0)


class TestNativeReferences:
    def test_clipped_surrogate_hand_values(self):
        # ratios e^{.5}=1.6487 (A>0 → clipped to 1.28), e^{-.5}=.6065 (A<0 → clipped to .8)
        ctx, logps = ctx_of([[0.5, -0.5]], [[0.0, 0.0]], [1.0], [[1.0, 1.0]])
        ctx.advantages = torch.tensor([[1.0, -1.0]])
        loss = clipped_surrogate(ctx, epsilon=0.2, epsilon_high=0.28, delta=None, importance_sampling_level="token")
        torch.testing.assert_close(loss, torch.tensor([[-1.28, 0.8]]))
        loss.sum().backward()
        torch.testing.assert_close(logps.grad, torch.zeros(1, 2))  # both clipped → no gradient

    def test_sequence_level_ratio_is_geometric(self):
        # GSPO: per-token ratios [2, 0.5] → sequence ratio exp(mean log) = 1
        ctx, _ = ctx_of([[math.log(2), math.log(0.5)]], [[0.0, 0.0]], [1.0], [[1.0, 1.0]])
        loss = clipped_surrogate(ctx, epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="sequence")
        torch.testing.assert_close(loss, torch.tensor([[-1.0]]))

    def test_cispo_gradient_flows_through_logp_only(self):
        ctx, logps = ctx_of([[math.log(7.0)]], [[0.0]], [2.0], [[1.0]])
        loss = cispo_surrogate(ctx, epsilon=0.2, epsilon_high=5.0, importance_sampling_level="token")
        assert loss.item() == pytest.approx(-5.0 * 2.0 * math.log(7.0))
        loss.sum().backward()
        assert logps.grad.item() == pytest.approx(-10.0)  # -sg(min(ρ,5))·A

    def test_sapo_gate_slope_one_at_ratio_one(self):
        ctx, logps = ctx_of([[0.0]], [[0.0]], [1.0], [[1.0]])
        loss = sapo_surrogate(ctx, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, importance_sampling_level="token")
        assert loss.item() == pytest.approx(-2.0)  # -(4/τ)σ(0)·A
        loss.sum().backward()
        assert logps.grad.item() == pytest.approx(-1.0)  # slope 1 at ρ = 1, as the clipped surrogate


class TestAggregate:
    LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])

    @pytest.mark.parametrize(
        "mode, kwargs, expected",
        [
            ("sequence_mean", {}, (1.5 + 5.0) / 2),
            ("token_mean", {}, 18.0 / 5),
            ("global_token_mean", {"global_num_tokens": 9.0}, 2.0),
            ("constant", {"max_completion_length": 6}, 18.0 / 12),
            ("sequence_sum", {}, (3.0 + 15.0) / 2),
        ],
    )
    def test_modes(self, mode, kwargs, expected):
        assert aggregate(self.LOSS, self.MASK, mode, **kwargs).item() == pytest.approx(expected)

    def test_bad_mode_and_missing_inputs(self):
        with pytest.raises(ValueError, match="Unknown loss_aggregation"):
            aggregate(self.LOSS, self.MASK, "median")
        with pytest.raises(ValueError, match="global_num_tokens"):
            aggregate(self.LOSS, self.MASK, "global_token_mean")
