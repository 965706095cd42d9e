"""Balanced Aggregation (`loss_type="balanced_agg"`, `loss_aggregation="balanced"`): the per-rollout scale, the
aggregate it gives, and the config checks."""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, balanced_agg_surrogate, balanced_sequence_scale

BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)


def test_catalog_check_one_third_two_thirds_and_length_invariance():
    # one group: a positive of 10 tokens, two negatives of 100 → c = [1/10, 2/200, 2/200]
    adv = torch.tensor([1.0, -1.0, -1.0])
    c = balanced_sequence_scale(adv, torch.tensor([10, 100, 100]), group_size=3)
    torch.testing.assert_close(c, torch.tensor([0.1, 0.01, 0.01]))
    # per-token losses l_P = 3 on the positive, l_N = 6 on the negatives → (1/3)·3 + (2/3)·6 = 5
    t = 200
    loss = torch.zeros(3, t)
    mask = torch.zeros(3, t)
    for i, (n, v) in enumerate([(10, 3.0), (100, 6.0), (100, 6.0)]):
        loss[i, :n], mask[i, :n] = v, 1.0
    torch.testing.assert_close(aggregate(loss, mask, "balanced", sequence_scale=c), torch.tensor(5.0))
    # doubling the negatives' lengths keeps the 1/3–2/3 split
    c2 = balanced_sequence_scale(adv, torch.tensor([10, 200, 200]), group_size=3)
    mask[1:, :200], loss[1:, :200] = 1.0, 6.0
    torch.testing.assert_close(aggregate(loss, mask, "balanced", sequence_scale=c2), torch.tensor(5.0))


def test_groups_are_separate_and_zero_advantages_form_their_own_class():
    # group 0: [+, +, -, 0] lengths [2, 6, 4, 5]; group 1: all negative lengths [1, 1, 2, 4]
    adv = torch.tensor([0.5, 1.0, -1.0, 0.0, -1.0, -2.0, -0.1, -3.0])
    lengths = torch.tensor([2, 6, 4, 5, 1, 1, 2, 4])
    c = balanced_sequence_scale(adv, lengths, group_size=4)
    # positives: 2 rollouts / 8 tokens; negative: 1/4; zero: 1/5; group 1: 4 rollouts / 8 tokens
    torch.testing.assert_close(c, torch.tensor([0.25, 0.25, 0.25, 0.2, 0.5, 0.5, 0.5, 0.5]))


def test_batch_scope_pools_classes_over_groups():
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    lengths = torch.tensor([1, 2, 3, 6])
    c = balanced_sequence_scale(adv, lengths, group_size=2, scope="batch")
    torch.testing.assert_close(c, torch.tensor([2 / 4, 2 / 8, 2 / 4, 2 / 8]))


def test_empty_and_dropped_rollouts_get_zero_and_do_not_count():
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    c = balanced_sequence_scale(adv, torch.tensor([0, 4, 3, 0]), group_size=4)
    torch.testing.assert_close(c, torch.tensor([0.0, 0.25, 1 / 3, 0.0]))


@pytest.mark.parametrize("group_size", [1, 2])
def test_small_groups(group_size):
    adv = torch.tensor([1.0, -1.0])
    c = balanced_sequence_scale(adv, torch.tensor([4, 2]), group_size=group_size)
    torch.testing.assert_close(c, torch.tensor([0.25, 0.5]))  # each rollout alone in its class either way


def test_equal_lengths_reduce_to_sequence_mean():
    # all lengths L: c_i = 1/L, so mean_i c_i Σ_t l = mean_i (Σ_t l / L) = GRPO's sequence mean
    torch.manual_seed(0)
    adv = torch.randn(8)
    loss, mask = torch.randn(8, 5), torch.ones(8, 5)
    c = balanced_sequence_scale(adv, mask.sum(-1), group_size=4)
    torch.testing.assert_close(aggregate(loss, mask, "balanced", sequence_scale=c), aggregate(loss, mask, "sequence_mean"))


def test_split_invariance():
    torch.manual_seed(1)
    adv, lengths = torch.randn(8), torch.randint(1, 6, (8,))
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    loss = torch.randn(8, 6)
    c = balanced_sequence_scale(adv, lengths, group_size=4)
    whole = aggregate(loss, mask, "balanced", sequence_scale=c)
    halves = sum(aggregate(loss[s], mask[s], "balanced", sequence_scale=c[s]) / 2 for s in (slice(0, 4), slice(4, 8)))
    torch.testing.assert_close(whole, halves)


def test_surrogate_gradient_is_grpos():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ctx = ObjectiveContext(logps, logps.detach(), torch.tensor([[2.0]]), torch.ones(1, 2))
    out = balanced_agg_surrogate(ctx, epsilon=0.2, epsilon_high=None)
    torch.testing.assert_close(out, torch.tensor([[-2.0, -2.0]]))  # on-policy ρ = 1 → -A
    out.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-2.0, -2.0]]))  # d(-Aρ)/dlogp = -Aρ


def test_errors():
    with pytest.raises(ValueError, match="needs sequence_scale"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "balanced")
    with pytest.raises(ValueError, match="balanced_agg_scope must be"):
        balanced_sequence_scale(torch.ones(2), torch.ones(2), 2, scope="x")
    with pytest.raises(ValueError, match="whole groups"):
        balanced_sequence_scale(torch.ones(3), torch.ones(3), 2)
    with pytest.raises(ValueError, match="balanced_agg_scope='x' is unknown"):
        GRPOConfig(**BASE, loss_type="balanced_agg", balanced_agg_scope="x")
    with pytest.raises(ValueError, match="only applies with loss_aggregation='balanced'"):
        GRPOConfig(**BASE, loss_type="gmpo", balanced_agg_scope="batch")
    with pytest.raises(ValueError, match="would replace it"):
        GRPOConfig(**BASE, loss_type="balanced_agg", loss_aggregation="token_mean")
    with pytest.raises(ValueError, match="only applies to trl_groupx objectives"):
        GRPOConfig(**BASE, loss_type="grpo", loss_aggregation="balanced")
    GRPOConfig(**BASE, loss_type="gmpo", loss_aggregation="balanced", balanced_agg_scope="batch")
