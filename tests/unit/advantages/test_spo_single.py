"""SPO (spo_single): per-prompt value tracker, batch normalisation, NaN handling, state, prompt keys.

Numbers derived by hand in the comments. Tracker: v̂ = α/(α+β); update once per visit α ← ρα + Σr,
β ← ρβ + Σ(1−r); new prompts start at α = β = 0.5 ("prior", official offline_N = 0)."""

import io
import os
import subprocess
import sys

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages._prompt_keys import prompt_key, prompt_keys_from_ids
from trl_groupx.advantages.spo_single import spo_single_advantages, spo_tracker_lookup

NAN = float("nan")


def spo(rewards, keys, state, group_size=None, **kw):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    keys = torch.tensor(keys, dtype=torch.int64)
    return spo_single_advantages(rewards, group_size or 1, prompt_keys=keys, state=state, **kw)


def tracker(state, key):
    ab, found = spo_tracker_lookup(state, torch.tensor([key]))
    assert found.item()
    return ab[0, 0].item(), ab[0, 1].item()


def test_one_group_1_1_0_moves_toward_two_thirds_at_rate_rho():
    state = {}
    a = spo([1, 1, 0], [5, 5, 5], state, group_size=3, spo_single_batch_norm=False)
    # prior v̂ = 0.5 → raw A = r − 0.5
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, -0.5]))
    # α = 0.875·0.5 + 2 = 2.4375, β = 0.875·0.5 + 1 = 1.4375
    alpha, beta = tracker(state, 5)
    assert alpha == pytest.approx(2.4375) and beta == pytest.approx(1.4375)
    # v̂' = w·0.5 + (1−w)·2/3 with w = ρN/(ρN+G) = 0.875/3.875
    w = 0.875 / 3.875
    assert alpha / (alpha + beta) == pytest.approx(w * 0.5 + (1 - w) * 2 / 3)
    # second visit uses v̂' = 2.4375/3.875 = 0.629032…
    a2 = spo([1, 1, 0], [5, 5, 5], state, group_size=3, spo_single_batch_norm=False)
    v1 = 2.4375 / 3.875
    torch.testing.assert_close(a2, torch.tensor([1 - v1, 1 - v1, -v1]))
    alpha, beta = tracker(state, 5)  # α = .875·2.4375 + 2 = 4.1328125, β = .875·1.4375 + 1 = 2.2578125
    assert alpha == pytest.approx(4.1328125) and beta == pytest.approx(2.2578125)
    for _ in range(200):  # fixed point: α = 2/(1−ρ) = 16, β = 1/(1−ρ) = 8, v̂ = 2/3
        spo([1, 1, 0], [5, 5, 5], state, group_size=3)
    alpha, beta = tracker(state, 5)
    assert alpha == pytest.approx(16.0) and beta == pytest.approx(8.0)


@pytest.mark.parametrize("rho, expected", [
    # three single visits 1, 1, 0 from α = β = 0.5:
    # ρ = .875: α .5 → 1.4375 → 2.2578125 → 1.9755859375;  β .5 → .4375 → .3828125 → 1.3349609375
    (0.875, 1.9755859375 / (1.9755859375 + 1.3349609375)),
    (1.0, 2.5 / 4.0),  # no forgetting: (0.5 + 2)/(1 + 3)
    (0.5, 0.8125 / 1.875),  # α .5 → 1.25 → 1.625 → .8125; β .5 → .25 → .125 → 1.0625
])
def test_single_visits_1_1_0_move_toward_two_thirds(rho, expected):
    state, values = {}, []
    for r in (1.0, 1.0, 0.0):
        spo([r], [11], state, spo_single_rho=rho)
        alpha, beta = tracker(state, 11)
        values.append(alpha / (alpha + beta))
    assert values[-1] == pytest.approx(expected)
    # after 1, 1 the tracker rises above the prior; the 0 pulls it down (fast forgetting weighs it most)
    assert 0.5 < values[0] < values[1] and values[2] < values[1]


def test_group_size_one_gives_nonzero_r_minus_v_hat():
    state = {}
    # four prompts, G = 1, all new: v̂ = 0.5 → raw A = r − 0.5 ≠ 0 (a group baseline would give 0)
    raw = spo([1, 0, 1, 1], [1, 2, 3, 4], state, spo_single_batch_norm=False)
    torch.testing.assert_close(raw, torch.tensor([0.5, -0.5, 0.5, 0.5]))
    # batch norm of the same raw values: mean .25, unbiased std sqrt(.75/3) = .5 → [.5, −1.5, .5, .5]
    normed = spo([1, 0, 1, 1], [1, 2, 3, 4], {})
    torch.testing.assert_close(normed, torch.tensor([0.5, -1.5, 0.5, 0.5]), atol=1e-6, rtol=0)


def test_batch_advantages_are_zero_mean_unit_std():
    torch.manual_seed(0)
    state = {}
    for _ in range(3):
        rewards = torch.randint(0, 2, (32,)).float()
        keys = torch.randint(0, 6, (8,)).repeat_interleave(4)
        a = spo_single_advantages(rewards, 4, prompt_keys=keys, state=state)
        assert abs(a.mean().item()) < 1e-6
        assert a.std().item() == pytest.approx(1.0, abs=1e-6)


def test_official_loop_transcription_matches_for_group_size_one():
    """verl-recipe@48ea0a79 spo/spo_ray_trainer.py: dict-per-prompt α/β (l.362-364, offline_N = 0), A = r − p̂
    (l.547), (A − mean)/(std + 1e-8) (l.551), α = ρα + r, β = ρβ + (1 − r) after the step (l.664-665), constant ρ."""
    torch.manual_seed(1)
    rho = 0.875
    prompts = ["p0", "p1", "p2", "p3", "p4"]
    alpha = {p: 0.5 for p in prompts}
    beta = {p: 0.5 for p in prompts}
    state = {}
    for _ in range(6):
        batch = [prompts[i] for i in torch.randperm(5)[:4].tolist()]  # distinct prompts, one response each
        r = torch.randint(0, 2, (4,)).float()
        a_t = torch.tensor([alpha[p] for p in batch])
        b_t = torch.tensor([beta[p] for p in batch])
        adv = r - a_t / (a_t + b_t)
        official = (adv - adv.mean()) / (adv.std() + 1e-8)
        for i, p in enumerate(batch):
            alpha[p] = (rho * a_t[i] + r[i]).item()
            beta[p] = (rho * b_t[i] + (1 - r[i])).item()
        ours = spo_single_advantages(r, 1, prompt_keys=torch.tensor([int(p[1]) for p in batch]), state=state)
        torch.testing.assert_close(ours, official, atol=1e-5, rtol=1e-5)
    for p in prompts:
        if alpha[p] != 0.5:
            assert tracker(state, int(p[1])) == pytest.approx((alpha[p], beta[p]), rel=1e-6)


def test_nan_rewards_get_zero_and_do_not_update_the_tracker():
    state = {}
    spo([1, 0], [7, 9], state, spo_single_batch_norm=False)  # 7: α=1.4375 β=.4375; 9: α=.4375 β=1.4375
    before = {k: tracker(state, k) for k in (7, 9)}
    # prompt 7 all-NaN this step: no update, no decay; prompt 9: one scored 1 and one NaN
    a = spo([NAN, NAN, 1, NAN], [7, 7, 9, 9], state, group_size=2, spo_single_batch_norm=False)
    v9 = 0.4375 / 1.875
    torch.testing.assert_close(a, torch.tensor([0.0, 0.0, 1 - v9, 0.0]))
    assert tracker(state, 7) == before[7]
    assert tracker(state, 9) == pytest.approx((0.875 * 0.4375 + 1, 0.875 * 1.4375 + 0))
    # a new prompt that is all-NaN gets no entry
    spo([NAN, NAN], [123, 123], state, group_size=2)
    assert not spo_tracker_lookup(state, torch.tensor([123]))[1].item()
    # NaN excluded from the batch statistics: normalised over the two scored rows only (raw .5, −.5 → ±1/√2)
    b = spo([1, NAN, 0, NAN], [40, 40, 41, 41], {}, group_size=2)
    s = 2 ** -0.5
    torch.testing.assert_close(b, torch.tensor([s, 0.0, -s, 0.0]), atol=1e-6, rtol=0)
    # a single scored rollout: A − mean = 0, finite
    c = spo([NAN, 1.0], [1, 1], {}, group_size=2)
    assert torch.equal(c, torch.zeros(2))


def test_all_equal_batch_and_group_size_two():
    a = spo([1, 1, 1, 1], [1, 1, 2, 2], {}, group_size=2)
    assert torch.equal(a, torch.zeros(4))  # all r − v̂ equal → 0 after centring
    a = spo([0, 0, 0, 0], [1, 1, 2, 2], {}, group_size=2)
    assert torch.equal(a, torch.zeros(4))
    state = {}
    raw = spo([1, 0, 0, 0], [1, 1, 2, 2], state, group_size=2, spo_single_batch_norm=False)
    torch.testing.assert_close(raw, torch.tensor([0.5, -0.5, -0.5, -0.5]))
    assert tracker(state, 1) == pytest.approx((1.4375, 1.4375))  # ρ·.5 + 1 each
    assert tracker(state, 2) == pytest.approx((0.4375, 2.4375))


def test_first_group_initialisation_uses_the_official_offline_formula():
    state = {}
    # N_init = 1/(1 − .875) = 8; α = 8·(3 + .5)/(4 + 1) = 5.6, β = 8·(1 + .5)/5 = 2.4 → v̂ = .7
    a = spo([1, 1, 0, 1], [3, 3, 3, 3], state, group_size=4, spo_single_init="first_group",
            spo_single_batch_norm=False)
    torch.testing.assert_close(a, torch.tensor([0.3, 0.3, -0.7, 0.3]))
    assert tracker(state, 3) == pytest.approx((5.6, 2.4))  # the group is the initialisation: not added again
    a = spo([0, 0, 0, 0], [3, 3, 3, 3], state, group_size=4, spo_single_init="first_group",
            spo_single_batch_norm=False)
    torch.testing.assert_close(a, torch.full((4,), -0.7))
    assert tracker(state, 3) == pytest.approx((0.875 * 5.6, 0.875 * 2.4 + 4))


def test_state_is_sorted_merged_and_round_trips():
    big = [prompt_key([i, i + 1]) for i in range(6)]  # realistic 63-bit keys, not in sorted order
    uninterrupted, state = {}, {}
    batches = [([1, 0, 1], big[:3]), ([0, 0, 1], big[3:]), ([1, 1, 0], [big[5], big[0], big[3]])]
    outputs = [spo(rewards, keys, uninterrupted) for rewards, keys in batches]
    spo(*batches[0], state)
    spo(*batches[1], state)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    restored = torch.load(buf, weights_only=True)  # tensors only: loads under weights_only
    out_a = spo(*batches[2], restored)
    assert torch.equal(restored["keys"], uninterrupted["keys"])
    assert torch.equal(restored["values"], uninterrupted["values"])
    assert torch.equal(restored["keys"], torch.sort(restored["keys"]).values)
    assert restored["keys"].dtype == torch.int64 and restored["values"].shape == (6, 2)
    assert torch.equal(out_a, outputs[2])


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="spo_single.*infinite"):
        spo([1, float("inf")], [1, 2], {})
    with pytest.raises(ValueError, match="prompt_keys must have shape"):
        spo_single_advantages(torch.ones(4), 2, prompt_keys=torch.zeros(2, dtype=torch.int64), state={})
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        spo_single_advantages(torch.ones(4, 2), 2, prompt_keys=torch.zeros(4, dtype=torch.int64), state={})


@pytest.mark.parametrize("flags, match", [
    ({"spo_single_rho": 1.5}, "spo_single_rho must be in"),
    ({"spo_single_rho": -0.1}, "spo_single_rho must be in"),
    ({"spo_single_init": "offline"}, "spo_single_init must be one of"),
    ({"spo_single_init": "first_group", "spo_single_rho": 1.0}, "spo_single_rho < 1"),
])
def test_config_validation(flags, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, advantage_estimator="spo_single", **flags)


def test_prompt_keys_ignore_padding_and_are_stable_across_processes():
    ids = torch.tensor([[0, 0, 5, 6, 7], [5, 6, 7, 0, 0], [0, 5, 6, 8, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0]])
    keys = prompt_keys_from_ids(ids, mask)
    assert keys.dtype == torch.int64 and (keys >= 0).all()
    assert keys[0] == keys[1] != keys[2]  # left/right padding never changes a key; different ids differ
    assert keys[0].item() == prompt_key([5, 6, 7])
    code = "from trl_groupx.advantages._prompt_keys import prompt_key; print(prompt_key([5, 6, 7]))"
    for seed in ("1", "2"):  # Python's hash() would differ between these interpreters; BLAKE2b does not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert int(out.stdout.strip().splitlines()[-1]) == keys[0].item()
