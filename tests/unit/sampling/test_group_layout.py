"""Variable group sizes (`sampling/group_layout.py`): GRPO's and GDPO's advantages over groups of different sizes
on hand-computed rewards, equality with TRL's fixed-size numbers when every size is G, edge cases (one-row groups,
NaN rewards, one scored row), the true zero-std fraction, layout checks, the prompt-selection seam dealing groups
of different sizes to processes, and the config-time refusals of stages that read fixed-size groups."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.advantages import decoupled_normalized_advantages, group_normalized_advantages
from trl_groupx.sampling.group_layout import (
    GroupLayout,
    variable_group_decoupled_advantages,
    variable_group_normalized_advantages,
    zero_std_fraction,
)
from trl_groupx.sampling.prompt_sampler import PromptSelectionSampler

NAN = float("nan")
EPS = 1e-4


def _sizes(*s):
    return torch.tensor(s, dtype=torch.int64)


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 10.0, 5.0])
    adv = variable_group_normalized_advantages(rewards, _sizes(3, 2, 1))
    # [0, 1, 2]: mean 1, unbiased std 1 → (−1, 0, 1) / 1.0001
    # [3, 10]: mean 6.5, std √((3.5² · 2) / 1) = 4.949747 → ∓3.5 / 4.949847
    # [5]: one row → 0
    s2 = math.sqrt(2 * 3.5**2)
    expected = [-1 / (1 + EPS), 0.0, 1 / (1 + EPS), -3.5 / (s2 + EPS), 3.5 / (s2 + EPS), 0.0]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-6, rtol=0)


def test_scale_rewards_none_and_batch_by_hand():
    rewards = torch.tensor([0.0, 2.0, 1.0, 1.0, 4.0])
    none = variable_group_normalized_advantages(rewards, _sizes(2, 3), scale_rewards="none")
    assert none.tolist() == [-1.0, 1.0, -1.0, -1.0, 2.0]  # means 1 and 2
    batch = variable_group_normalized_advantages(rewards, _sizes(2, 3), scale_rewards="batch")
    # unbiased std of the raw rewards over the batch: mean 1.6, squared deviations sum to 9.2 → √(9.2 / 4) = √2.3
    std = math.sqrt(2.3)
    assert torch.allclose(batch, none / (std + EPS), atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="scale_rewards must be"):
        variable_group_normalized_advantages(rewards, _sizes(2, 3), scale_rewards="max")


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_equal_sizes_reproduce_trl_bit_for_bit(scale_rewards, group_size):
    rewards = torch.tensor([0.3, 1.0, NAN, 0.7, 0.2, 0.2, 0.9, 0.1])
    fixed = group_normalized_advantages(rewards, group_size, scale_rewards=scale_rewards)
    variable = variable_group_normalized_advantages(rewards, _sizes(*[group_size] * (8 // group_size)),
                                                    scale_rewards=scale_rewards)
    assert torch.equal(fixed, variable)


def test_nan_rewards_and_one_scored_row_give_zero():
    rewards = torch.tensor([NAN, 1.0, NAN, 0.0, 1.0, NAN, NAN])
    adv = variable_group_normalized_advantages(rewards, _sizes(3, 2, 2))
    # group 1: one scored row (std NaN) → 0 everywhere; group 2: [0, 1] → ∓0.5 / (0.707107 + 1e−4); group 3 all NaN
    s = math.sqrt(0.5)
    assert torch.allclose(adv, torch.tensor([0, 0, 0, -0.5 / (s + EPS), 0.5 / (s + EPS), 0, 0.0]), atol=1e-6)
    assert torch.isfinite(adv).all()


def test_all_equal_groups_are_zero():
    adv = variable_group_normalized_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]), _sizes(3, 2))
    assert torch.equal(adv, torch.zeros(5))


def test_decoupled_by_hand_and_equal_sizes_match_gdpo():
    # two reward functions; groups [rows 0-2], [rows 3-4]
    per_func = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 2.0], [0.0, 1.0], [1.0, NAN]])
    adv = variable_group_decoupled_advantages(per_func, _sizes(3, 2))
    # function 0, group 1 [1, 0, 1]: mean 2/3, std √(1/3) → (1/3, −2/3, 1/3)/(0.57735 + ε)
    # function 1, group 1 [0, 0, 2]: mean 2/3, std √(4/3) → (−2/3, −2/3, 4/3)/(1.154701 + ε)
    # function 0, group 2 [0, 1]: ∓0.5/(0.707107 + ε); function 1, group 2 [1, NaN]: one value, std NaN → NaN, skipped
    a, b, c = math.sqrt(1 / 3) + EPS, math.sqrt(4 / 3) + EPS, math.sqrt(0.5) + EPS
    summed = torch.tensor([1 / 3 / a - 2 / 3 / b, -2 / 3 / a - 2 / 3 / b, 1 / 3 / a + 4 / 3 / b, -0.5 / c, 0.5 / c])
    expected = (summed - summed.mean()) / (summed.std() + EPS)
    assert torch.allclose(adv, expected, atol=1e-5, rtol=0)
    weights = torch.tensor([1.0, 0.5])
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    assert torch.equal(variable_group_decoupled_advantages(rewards, _sizes(2, 2), reward_weights=weights),
                       decoupled_normalized_advantages(rewards, 2, reward_weights=weights))


def test_zero_std_fraction_counts_rows_of_flat_groups():
    # groups [1, 1] (flat), [1, 0, 0] (not), [5] (one row: std 0, as TRL counts num_generations = 1)
    assert zero_std_fraction(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 5.0]), _sizes(2, 3, 1)) == pytest.approx(3 / 6)


def test_layout_checks():
    layout = GroupLayout.from_sizes([3, 1, 2], 6, "owner")
    assert layout.group_ids().tolist() == [0, 0, 0, 1, 2, 2] and layout.num_rows == 6
    with pytest.raises(ValueError, match="owner: group sizes \\[3, 2\\] sum to 5, but the generation batch has 6"):
        GroupLayout.from_sizes([3, 2], 6, "owner")
    for bad in ([3, 0, 3], [], [2.0, 4.0]):
        with pytest.raises(ValueError, match="owner: group sizes must be a non-empty list of integers ≥ 1"):
            GroupLayout.from_sizes(bad, 6, "owner")
    with pytest.raises(ValueError, match="6 rollouts for group sizes summing to 5"):
        variable_group_normalized_advantages(torch.zeros(6), _sizes(3, 2))


class _Accelerator:
    def __init__(self, rank, world):
        self.process_index, self.num_processes = rank, world


class _Trainer:
    def __init__(self, rank, world, state):
        self.accelerator = _Accelerator(rank, world)
        self.variant_state = {"toy": state}
        self.args = trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, num_generations=4,
                                          per_device_train_batch_size=4)


def _toy_selection(state, num_prompts, dataset_size, *, seed):
    return [5, 1, 3], [3, 2, 3]  # 8 rows = 2 prompts × G = 4


@pytest.mark.parametrize("rank", [0, 1])
def test_seam_deals_variable_groups_to_processes(rank):
    state = {}
    trainer = _Trainer(rank, 2, state)
    trainer.num_generations, trainer.num_iterations = 4, 1
    dataset = [{"prompt": i} for i in range(8)]
    sampler = PromptSelectionSampler(trainer, dataset, _toy_selection, "toy")
    sampler.prompts_per_batch = 2  # 2 processes × 4 rows / G
    rows = sampler.generation_rows([{}] * 4)
    # global rows 5 5 5 1 1 3 3 3: process 0 takes the first four (prompt 1's group straddles), process 1 the rest
    assert [r["prompt"] for r in rows] == [[5, 5, 5, 1], [1, 3, 3, 3]][rank]
    assert sampler.layout.sizes.tolist() == [3, 2, 3]
    assert state["pending"].tolist() == [5, 1, 3] and state["pending_sizes"].tolist() == [3, 2, 3]


def test_seam_refuses_sizes_that_miss_the_row_budget():
    trainer = _Trainer(0, 1, {})
    trainer.num_generations, trainer.num_iterations = 4, 1
    sampler = PromptSelectionSampler(trainer, [{"prompt": i} for i in range(8)],
                                     lambda state, n, size, *, seed: ([1, 2], [4, 3]), "toy")
    with pytest.raises(ValueError, match="group sizes \\[4, 3\\] sum to 7, but the generation batch has 4 rows"):
        sampler.generation_rows([{}] * 8)


def test_pending_outcomes_per_selected_prompt_fixed_and_variable_groups():
    from trl_groupx.contracts import RolloutBatch
    from trl_groupx.sampling import keep_all
    from trl_groupx.sampling.prompt_sampler import pending_outcomes

    rewards = torch.tensor([1.0, 0.0, NAN, 1.0, 0.5, 1.0])
    fixed = RolloutBatch(rewards, torch.ones(6), group_size=3)
    assert pending_outcomes(fixed, {}, "toy", 1.0) is None  # nothing selected: an evaluation copy
    pending, successes, trials = pending_outcomes(fixed, {"pending": torch.tensor([7, 2])}, "toy", 1.0)
    # prompt 7: [1, 0, NaN] → 1 success of 2 trials; prompt 2: [1, 0.5, 1] → 2 of 3 (0.5 < threshold 1)
    assert (pending.tolist(), successes.tolist(), trials.tolist()) == ([7, 2], [1, 2], [2, 3])
    variable = RolloutBatch(rewards, torch.ones(6), group_size=3, group_sizes=torch.tensor([4, 2]))
    _, successes, trials = pending_outcomes(variable, {"pending": torch.tensor([7, 2])}, "toy", 1.0)
    # [1, 0, NaN, 1]: 2 successes of 3 trials; [0.5, 1]: 1 of 2
    assert (successes.tolist(), trials.tolist()) == ([2, 1], [3, 2])
    with pytest.raises(ValueError, match="rollout_filter='toy': 6 rollouts for 3 selected prompts of 3 rollouts"):
        pending_outcomes(fixed, {"pending": torch.tensor([1, 2, 3])}, "toy", 1.0)
    assert keep_all(fixed, "toy").tolist() == [True] * 6
    with pytest.raises(ValueError, match="rollout_filter='toy' got an infinite reward"):
        keep_all(RolloutBatch(torch.tensor([float("inf")]), torch.ones(1), 1), "toy")


@pytest.mark.parametrize("variant_id", sorted(__import__("trl_groupx.sampling.group_layout", fromlist=["x"])
                                              .GROUP_LOCAL_ESTIMATORS))
def test_group_local_estimators_do_not_read_other_groups(variant_id):
    """The declaration behind GROUP_LOCAL_ESTIMATORS: with the registry flags, an estimator's advantages on a batch
    equal its advantages on each group alone (binary rewards with a NaN; G = 4 and G = 2)."""
    from trl_groupx.contracts import config_kwargs
    from trl_groupx.sampling.group_layout import group_local, per_group_advantages

    variant = trl_groupx.get_variant(variant_id)
    config = trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **variant.flags)
    assert group_local(variant_id, config)
    kwargs = config_kwargs(variant.fn, config)
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (24,), generator=generator).float()
    rewards[5] = NAN
    for size in (4, 2):
        whole = variant.fn(rewards, size, **kwargs)
        split = per_group_advantages(lambda group, g: variant.fn(group, g, **kwargs), rewards,
                                     _sizes(*[size] * (24 // size)))
        if isinstance(whole, tuple):
            assert torch.allclose(whole[0], split[0], atol=1e-6) and torch.equal(whole[1], split[1])
        else:
            assert torch.allclose(whole, split, atol=1e-6)


def test_variable_groups_accept_group_local_estimators_only():
    base = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="sgpo", num_generations=4,
                per_device_train_batch_size=8)
    assert trl_groupx.GRPOConfig(**base, advantage_estimator="rloo").advantage_estimator == "rloo"
    assert trl_groupx.GRPOConfig(**base, advantage_estimator="focal_tailmiss").advantage_estimator == "focal_tailmiss"
    with pytest.raises(ValueError, match="advantage_estimator='focal_tailmiss' reads groups as"):
        trl_groupx.GRPOConfig(**base, advantage_estimator="focal_tailmiss", scale_rewards="batch")
    with pytest.raises(ValueError, match="advantage_estimator='gpg_valid_rescale' reads groups as .*'rloo'"):
        trl_groupx.GRPOConfig(**base, advantage_estimator="gpg_valid_rescale")
    with pytest.raises(ValueError, match="but generation_temperatures assigns a temperature to each slot"):
        trl_groupx.GRPOConfig(**base, generation_temperatures=[0.7, 1.0, 1.0, 1.3])


def test_per_group_advantages_by_hand():
    from trl_groupx.advantages.rloo import rloo_advantages
    from trl_groupx.sampling.group_layout import per_group_advantages

    # RLOO: A_i = M/(M−1)·(r_i − mean): [1, 0, 0] → 3/2·(1 − 1/3) = 1, 3/2·(−1/3) = −0.5; [1, 1] → 0; [0, 2] → ∓2
    adv = per_group_advantages(rloo_advantages, torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 2.0]), _sizes(3, 2, 2))
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, -2.0, 2.0]))


@pytest.mark.parametrize("variant_id", sorted(__import__("trl_groupx.sampling.group_layout", fromlist=["x"])
                                              .GROUP_AGNOSTIC_TOKEN_WEIGHTS))
def test_group_agnostic_token_weights_do_not_read_the_group_size(variant_id):
    """The declaration behind GROUP_AGNOSTIC_TOKEN_WEIGHTS: told groups of 4, 2 or 8 over the same rows, the variant
    returns the same token advantages (conflicting rows in one group, so a variant that compared rows would move)."""
    from trl_groupx.contracts import TokenContext, config_kwargs
    from trl_groupx.sampling.group_layout import GROUP_AGNOSTIC_TOKEN_WEIGHTS

    variant = trl_groupx.get_variant(variant_id)
    flags = {**variant.flags, "wapo_positive_group_scale": False} if variant_id == "wapo" else variant.flags
    config = trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **flags)
    assert GROUP_AGNOSTIC_TOKEN_WEIGHTS[variant_id](config)
    kwargs = config_kwargs(variant.fn, config)
    if "global_step" in variant.requires:
        kwargs.update(global_step=3, total_steps=10)
    generator = torch.Generator().manual_seed(0)
    n, t = 8, 5
    mask = torch.ones(n, t)
    mask[1, 3:] = 0
    mask[5] = 0  # an empty completion
    ids = torch.randint(0, 3, (n, t), generator=generator)
    ids[1] = ids[0]  # the same tokens in a positive and a negative row
    logps = -torch.rand(n, t, generator=generator)
    rewards = torch.tensor([1.0, 0.0, 1.0, NAN, 0.0, 1.0, 0.0, 0.0])
    entropies = torch.rand(n, t, generator=generator) * 2
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.0, -0.5, 0.7, -0.2, 0.3])
    outs = [variant.fn(advantages.clone(), TokenContext(mask, g, entropies=entropies, logps=logps,
                                                         ref_logps=logps - 0.1, rewards=rewards, completion_ids=ids),
                       **kwargs) for g in (4, 2, 8)]
    assert all(torch.allclose(outs[0], o, atol=1e-6) for o in outs[1:])


def test_variable_groups_accept_group_agnostic_token_weights_only():
    base = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="sgpo", num_generations=4,
                per_device_train_batch_size=8)
    assert trl_groupx.GRPOConfig(**base, token_weighting="lopti").token_weighting == "lopti"
    with pytest.raises(ValueError, match="but token_weighting='wapo' reads groups"):
        trl_groupx.GRPOConfig(**base, token_weighting="wapo", scale_rewards="none")  # its paper default counts groups
    assert trl_groupx.GRPOConfig(**base, token_weighting="wapo", scale_rewards="none",
                                 wapo_positive_group_scale=False).token_weighting == "wapo"
    with pytest.raises(ValueError, match="but token_weighting='gtpo_conflict' reads groups"):
        trl_groupx.GRPOConfig(**base, token_weighting="gtpo_conflict")
