"""REINFORCE++ (no baseline) advantages: hand-derived numbers, verl token-level parity, edge cases."""

import pytest
import torch

from trl_groupx.advantages import reinforce_pp_advantages
from trl_groupx.registry import get_variant

NAN, INF = float("nan"), float("inf")


def rpp(r, lengths, g=2):
    return reinforce_pp_advantages(torch.tensor(r, dtype=torch.float64), g,
                                   completion_lengths=torch.tensor(lengths, dtype=torch.float32))


def verl_reference(rewards, lengths, gamma=1.0):
    """Token-level transcription of verl compute_reinforce_plus_plus_outcome_advantage + masked_whiten (read from
    verl-project/verl@1dda039b: reward on the last valid token, discounted return, whitening over valid tokens)."""
    n, t_max = len(rewards), int(max(lengths))
    mask = torch.zeros(n, t_max, dtype=torch.float64)
    tok_r = torch.zeros(n, t_max, dtype=torch.float64)
    for i, (r, L) in enumerate(zip(rewards, lengths)):
        mask[i, :L] = 1
        tok_r[i, L - 1] = r
    returns = torch.zeros_like(tok_r)
    run = torch.zeros(n, dtype=torch.float64)
    for t in reversed(range(t_max)):
        new = tok_r[:, t] + gamma * run
        returns[:, t] = new * mask[:, t]
        run = new * mask[:, t] + run * (1 - mask[:, t])
    mean = (returns * mask).sum() / (mask.sum() + 1e-8)
    var = ((returns - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8) * mask.sum() / (mask.sum() - 1)
    adv = (returns - mean) * torch.rsqrt(var + 1e-8) * mask
    return torch.stack([adv[i, L - 1] for i, L in enumerate(lengths)]), adv, mask


def test_registration():
    v = get_variant("reinforce_pp")
    assert v.requires == ("completion_lengths",)


def test_hand_values_length_weighted():
    # r = [1, 0], L = [1, 3]: T = 4, μ = 1/4; Σ L(r−μ)² = .5625 + 3·.0625 = .75; /T = .1875; ·T/(T−1) = .25
    # σ = .5 → A = [.75/.5, −.25/.5] = [1.5, −.5] (up to the 1e-8 epsilons)
    torch.testing.assert_close(rpp([1, 0], [1, 3]), torch.tensor([1.5, -0.5], dtype=torch.float64), atol=1e-6, rtol=0)


def test_equal_lengths_no_group_baseline():
    # r = [1,1,0,0] (two all-equal groups of 2), L = 2 each: T = 8, μ = .5, Σ L d² = 8·.25 = 2; /8·8/7 = 2/7
    # A = ±.5/sqrt(2/7) = ±0.9354; all-equal groups keep nonzero advantages (no group baseline)
    a = rpp([1, 1, 0, 0], [2, 2, 2, 2])
    s = 0.5 / (2 / 7) ** 0.5
    torch.testing.assert_close(a, torch.tensor([s, s, -s, -s], dtype=torch.float64), atol=1e-6, rtol=0)


def test_matches_verl_token_level():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(12, generator=g, dtype=torch.float64).tolist()
    lengths = torch.randint(1, 9, (12,), generator=g).tolist()
    ref, adv_tok, mask = verl_reference(r, lengths)
    ours = rpp(r, lengths, g=4)
    torch.testing.assert_close(ours, ref)
    # every valid token of rollout i carries A_i in verl
    torch.testing.assert_close(adv_tok, ours[:, None].expand_as(adv_tok) * mask)


def test_all_equal_batch_and_small_batches():
    # no spread: var = 0 → A = 0·rsqrt(1e-8) = 0 (verl's T+1e-8 mean leaves a ~1e-5 residual; we divide by T)
    assert torch.equal(rpp([0.7] * 4, [3, 1, 2, 5]), torch.zeros(4, dtype=torch.float64))
    # G=1 is just the batch: r=[1,0], L=[2,2]: T=4, μ=.5, var = 4·.25/4·4/3 = 1/3 → A = ±.5·√3
    torch.testing.assert_close(rpp([1, 0], [2, 2], g=1), torch.tensor([0.5 * 3 ** 0.5, -0.5 * 3 ** 0.5],
                                                                     dtype=torch.float64), atol=1e-6, rtol=0)
    # fewer than two tokens in the batch → zeros (verl raises)
    assert torch.equal(rpp([1, 0], [1, 0]), torch.zeros(2, dtype=torch.float64))


def test_nan_and_empty_excluded_inf_raises():
    # NaN and zero-length rollouts get 0 and leave the statistics unchanged
    a = rpp([1, NAN, 0, 0.3], [1, 4, 3, 0])
    torch.testing.assert_close(a[[0, 2]], rpp([1, 0], [1, 3]))
    assert a[1] == 0 and a[3] == 0
    for bad in (INF, -INF):
        with pytest.raises(ValueError, match="reinforce_pp"):
            rpp([1, bad], [2, 2])
    with pytest.raises(ValueError, match="completion length"):
        rpp([1, 0], [2, -1])
    with pytest.raises(ValueError, match="does not match"):
        rpp([1, 0], [2, 2, 2])
