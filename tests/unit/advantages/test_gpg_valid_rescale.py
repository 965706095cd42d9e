"""GPG valid-group rescaling A = (r − mean_g)·B/(B − M): hand-derived numbers, official fixture, edge cases."""

from types import SimpleNamespace

import pytest
import torch

from trl_groupx.advantages import gpg_valid_rescale_advantages
from trl_groupx.advantages.gpg_valid_rescale import _validate

NAN, INF = float("nan"), float("inf")


def gv(r, g, **kw):
    return gpg_valid_rescale_advantages(torch.tensor(r, dtype=torch.float64), g, **kw)


def official_fixture(rewards, g, scale_rewards=False):
    """Read from AMAP-ML/GPG@e096da8 gpg_trainer.py (one generation round, no resampling): A = r − mean (÷ std+1e-4
    if scale_rewards), inverse_alpha = min(1, (#groups with std != 0)/#groups); loss / inverse_alpha ≡ A / inverse_alpha."""
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, g)
    adv = r - r.mean(1, keepdim=True)
    if scale_rewards:
        adv = adv / (r.std(1, keepdim=True) + 1e-4)
    inv = min(1.0, ((r.std(1) == 0).logical_not()).sum().item() / r.shape[0])
    return (adv / inv).reshape(-1)


def test_hand_values_alpha():
    # B = 4 groups of 2: [1,0] valid, [1,1], [0,0] invalid, [.5,0] valid → M = 2, α = 4/2 = 2
    # A = (r − mean)·2: [.5,−.5]·2 = [1,−1]; [.25,−.25]·2 = [.5,−.5]; invalid groups 0
    a = gv([1, 0, 1, 1, 0, 0, 0.5, 0], 2)
    torch.testing.assert_close(a, torch.tensor([1, -1, 0, 0, 0, 0, 0.5, -0.5], dtype=torch.float64))
    torch.testing.assert_close(a, official_fixture([1, 0, 1, 1, 0, 0, 0.5, 0], 2))


def test_all_valid_is_plain_group_mean():
    # M = 0 → α = 1: Dr.GRPO-style A = r − mean; G=3: [1,0,0] → [2/3, −1/3, −1/3]
    torch.testing.assert_close(gv([1, 0, 0, 0, 1, 1], 3),
                               torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3], dtype=torch.float64))


def test_cap_from_min_inverse_alpha():
    # B = 4, M = 3: official-like α would be 4; the floor 0.5 caps α at 2: [1,0] → [.5,−.5]·2
    r = [1, 0, 1, 1, 0, 0, 1, 1]
    torch.testing.assert_close(gv(r, 2), torch.tensor([1, -1, 0, 0, 0, 0, 0, 0], dtype=torch.float64))
    # floor 0.25 → α = 4 (= the official value for this single round)
    a = gv(r, 2, gpg_valid_rescale_min_inverse_alpha=0.25)
    torch.testing.assert_close(a, torch.tensor([2, -2, 0, 0, 0, 0, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(a, official_fixture(r, 2))


def test_scale_rewards_option():
    # [1,0,0,0] std (unbiased) = .5 → (r − .25)/(.5 + 1e-4); one of two groups valid → α = 2
    r = [1, 0, 0, 0, 1, 1, 1, 1]
    a = gv(r, 4, gpg_valid_rescale_scale_rewards=True)
    torch.testing.assert_close(a[:4], torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64) / 0.5001 * 2)
    torch.testing.assert_close(a, official_fixture(r, 4, scale_rewards=True))


def test_all_equal_batch_and_small_groups():
    assert torch.equal(gv([1, 1, 0, 0], 2), torch.zeros(4, dtype=torch.float64))
    # G = 1: every group has one member → invalid → zeros
    assert torch.equal(gv([1, 0, 0.3], 1), torch.zeros(3, dtype=torch.float64))
    # G = 2 with one valid of one group: α = 1 → ±.5
    torch.testing.assert_close(gv([1, 0], 2), torch.tensor([0.5, -0.5], dtype=torch.float64))


def test_nan_excluded_and_inf_raises():
    # [1, NaN, 0, 0] → scored [1,0,0]: mean 1/3; [NaN, 1, NaN, NaN] has one scored → invalid; B=2, M=1 → α = 2
    a = gv([1, NAN, 0, 0, NAN, 1, NAN, NAN], 4)
    torch.testing.assert_close(a, torch.tensor([4 / 3, 0, -2 / 3, -2 / 3, 0, 0, 0, 0], dtype=torch.float64))
    assert torch.equal(gv([NAN] * 4, 2), torch.zeros(4, dtype=torch.float64))
    for bad in (INF, -INF):
        with pytest.raises(ValueError, match="gpg_valid_rescale"):
            gv([1, bad], 2)


def test_dtype_and_validate():
    assert gpg_valid_rescale_advantages(torch.tensor([1.0, 0.0]), 2).dtype == torch.float32
    _validate(SimpleNamespace(gpg_valid_rescale_min_inverse_alpha=0.5))
    for bad in (0, 1.5, NAN, -0.1):
        with pytest.raises(ValueError, match="gpg_valid_rescale_min_inverse_alpha"):
            _validate(SimpleNamespace(gpg_valid_rescale_min_inverse_alpha=bad))
