"""sGPO: success rates from profiling rewards, the kept set and its order (hand-built p̂ lists), the seeded
sub-sampling of unsolvable prompts, serving the curriculum batch by batch, the rollout-filter call, config checks."""

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.prompt_sampler import selection_for
from trl_groupx.sampling.sgpo import sgpo, sgpo_curriculum, sgpo_select, success_rates

NAN = float("nan")


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "sgpo",
            "num_generations": 4, "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


def _d(values):
    return torch.tensor(values, dtype=torch.float64)


# ---- success rates -------------------------------------------------------------------------------------------------


def test_success_rates_by_hand():
    rewards = _d([[1.0, 0.0, 1.0, 1.0],      # 3 of 4 above 0.5 → 0.75
                  [0.5, 0.5, 0.0, 0.6],      # 0.5 is not above the threshold: only 0.6 → 0.25
                  [NAN, 1.0, NAN, 0.0],      # NaN samples are no trials: 1 of 2 → 0.5
                  [NAN, NAN, NAN, NAN]])     # nothing scored → NaN
    p = success_rates(rewards, 0.5)
    assert p[:3].tolist() == [0.75, 0.25, 0.5] and torch.isnan(p[3])


def test_success_rates_refuse_infinite_rewards():
    with pytest.raises(ValueError, match="infinite reward"):
        success_rates(_d([[1.0, float("inf")]]), 0.5)


# ---- kept set and order ------------------------------------------------------------------------------------------


P_HAT = [1.0, 0.25, 0.75, 0.0, 0.5, 1.0, 0.0, 0.75]


def test_easy_to_hard_drops_trivial_and_sorts_by_decreasing_success():
    # trivial 0 and 5 removed; f = 0 drops the unsolvable 3 and 6; decreasing p̂, ties by index: 2, 7 (0.75), 4, 1
    assert sgpo_curriculum(_d(P_HAT), 0.0, "easy_to_hard", seed=0) == [2, 7, 4, 1]
    assert sgpo_curriculum(_d(P_HAT), 0.0, "hard_to_easy", seed=0) == [1, 4, 2, 7]


def test_kept_unsolvable_prompts_come_last_in_easy_to_hard():
    # f = 1 keeps both unsolvable prompts (3 and 6, p̂ = 0), the hardest: after 1 (0.25), by index
    assert sgpo_curriculum(_d(P_HAT), 1.0, "easy_to_hard", seed=0) == [2, 7, 4, 1, 3, 6]
    # f = 0.5 of n₀ = 2: ⌊1 + ½⌋ = 1 kept; NumPy permutation(2) seeded [0] is [0, 1] → the first, prompt 3
    assert sgpo_curriculum(_d(P_HAT), 0.5, "easy_to_hard", seed=0) == [2, 7, 4, 1, 3]


def test_unsolvable_subsample_follows_the_seed():
    p = _d([0.5, 0.0, 0.5, 0.0, 0.0, 0.5, 0.0])  # unsolvable: 1, 3, 4, 6 (positions 0..3 of that list)
    # keep ⌊0.5·4 + ½⌋ = 2. seed 0: permutation(4) = [2, 0, 1, 3] → positions 0, 2 → prompts 1, 4
    assert sgpo_curriculum(p, 0.5, "easy_to_hard", seed=0) == [0, 2, 5, 1, 4]
    # seed 2: permutation(4) = [3, 2, 0, 1] → positions 2, 3 → prompts 4, 6
    assert sgpo_curriculum(p, 0.5, "easy_to_hard", seed=2) == [0, 2, 5, 4, 6]
    assert sgpo_curriculum(p, 0.5, "easy_to_hard", seed=2) == sgpo_curriculum(p, 0.5, "easy_to_hard", seed=2)
    # ⌊0.3·4 + ½⌋ = 1, ⌊0.6·4 + ½⌋ = 2, ⌊0.1·4 + ½⌋ = 0
    assert len(sgpo_curriculum(p, 0.3, "easy_to_hard", seed=0)) == 3 + 1
    assert len(sgpo_curriculum(p, 0.6, "easy_to_hard", seed=0)) == 3 + 2
    assert sgpo_curriculum(p, 0.1, "easy_to_hard", seed=0) == [0, 2, 5]


def test_shuffled_is_a_seeded_permutation_of_the_same_kept_set():
    # kept {1, 2, 4, 7}; NumPy permutation(4) seeded [0, 1] = [3, 0, 2, 1] → [7, 1, 4, 2]
    assert sgpo_curriculum(_d(P_HAT), 0.0, "shuffled", seed=0) == [7, 1, 4, 2]
    other = sgpo_curriculum(_d(P_HAT), 0.0, "shuffled", seed=1)
    assert sorted(other) == [1, 2, 4, 7]


def test_unscored_prompts_are_dropped():
    # p̂ = NaN: no reward function scored any profiling completion of prompt 1
    assert sgpo_curriculum(_d([0.5, NAN, 0.25]), 1.0, "easy_to_hard", seed=0) == [0, 2]


def test_all_solved_is_a_clear_error():
    with pytest.raises(ValueError, match=r"no prompt to train on \(3 of 3 solved by every profiling sample"):
        sgpo_curriculum(_d([1.0, 1.0, 1.0]), 0.1, "easy_to_hard", seed=0)
    # unsolvable only, f too small to keep one: ⌊0.1·2 + ½⌋ = 0
    with pytest.raises(ValueError, match="raise sgpo_unsolvable_keep"):
        sgpo_curriculum(_d([0.0, 1.0, 0.0]), 0.1, "easy_to_hard", seed=0)


# ---- serving the curriculum ----------------------------------------------------------------------------------------


def _flags(**kw):
    return {"seed": 0, "sgpo_profile_samples": 4, "sgpo_success_threshold": 0.5, "sgpo_unsolvable_keep": 0.1,
            "sgpo_order": "easy_to_hard", **kw}


def test_select_walks_the_curriculum_and_wraps():
    assert selection_for("sgpo") is sgpo_select
    # a profiled state (as a resumed run restores it): no trainer needed, no profiling
    state = {"p_hat": _d(P_HAT), "order": torch.tensor([2, 7, 4, 1, 3]), "served": 0}
    batches = [sgpo_select(state, 2, 8, **_flags()) for _ in range(4)]
    # positions 0-1, 2-3, 4-0 (wrap: the curriculum restarts from the easiest), 1-2
    assert batches == [[2, 7], [4, 1], [3, 2], [7, 4]] and state["served"] == 8


def test_select_errors():
    state = {"p_hat": _d(P_HAT), "order": torch.tensor([2]), "served": 0}
    with pytest.raises(ValueError, match="kept 1 prompts after profiling but a generation batch needs 2"):
        sgpo_select(state, 2, 8, **_flags())
    with pytest.raises(ValueError, match="profiled 8 prompts but the train dataset has 9"):
        sgpo_select(state, 1, 9, **_flags())
    with pytest.raises(ValueError, match="must pass `trainer`"):
        sgpo_select({}, 1, 8, **_flags())


def test_rollout_filter_keeps_everything_and_consumes_pending():
    state = {"pending": torch.tensor([2, 7])}
    batch = RolloutBatch(rewards=torch.tensor([1.0, 0.0, NAN, 1.0, 0.0, 0.0, 1.0, 1.0]),
                         completion_lengths=torch.full((8,), 3), group_size=4)
    keep = sgpo(batch, state=state)
    assert keep.dtype == torch.bool and keep.all() and keep.shape == (8,)
    assert state["pending"].numel() == 0
    with pytest.raises(ValueError, match="8 rollouts for 3 selected prompts of 4"):
        sgpo(batch, state={"pending": torch.tensor([1, 2, 3])})


# ---- config ---------------------------------------------------------------------------------------------------------


def test_registry_defaults_pass_and_bad_flags_fail_at_construction():
    config = _config()
    assert (config.sgpo_profile_samples, config.sgpo_unsolvable_keep, config.sgpo_order) == (4, 0.1, "easy_to_hard")
    assert trl_groupx.get_variant("sgpo").flags["sgpo_profile_samples"] == 4
    for flag, value, match in [
        ("sgpo_profile_samples", 1, "sgpo_profile_samples=1: use an integer ≥ 2"),
        ("sgpo_profile_samples", 2.0, "sgpo_profile_samples=2.0"),
        ("sgpo_unsolvable_keep", 1.5, r"sgpo_unsolvable_keep=1.5: use a fraction in \[0, 1\]"),
        ("sgpo_unsolvable_keep", -0.1, "sgpo_unsolvable_keep=-0.1"),
        ("sgpo_success_threshold", NAN, "sgpo_success_threshold=nan: use a finite reward"),
        ("sgpo_order", "random", "sgpo_order='random': use one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            _config(**{flag: value})


@pytest.mark.parametrize("group_size", [1, 2])
def test_rollout_filter_small_groups(group_size):
    # two prompts pending, groups of 1 or 2: every rollout kept, NaN rewards included
    rewards = torch.tensor([1.0, NAN, 0.0, 1.0])[: 2 * group_size]
    batch = RolloutBatch(rewards=rewards, completion_lengths=torch.ones(2 * group_size), group_size=group_size)
    state = {"pending": torch.tensor([4, 1])}
    assert sgpo(batch, state=state).tolist() == [True] * (2 * group_size) and state["pending"].numel() == 0


# ---- group size G = 1/p̂ (variable groups) ---------------------------------------------------------------------------


def test_inverse_success_group_sizes_by_hand():
    from trl_groupx.sampling.sgpo import inverse_success_group_sizes

    p = _d([0.25, 0.5, 0.75, 1 / 3, 0.0, 0.1, NAN, 1.0])
    # ⌈1/p̂⌉: 4, 2, ⌈1.33⌉ = 2, 3 (1/(1/3) is 3 in floats, not rounded up), p̂ = 0 → cap, ⌈10⌉ capped at 8,
    # unscored → cap, p̂ = 1 → 1 raised to the floor of 2
    assert inverse_success_group_sizes(p, 8).tolist() == [4, 2, 2, 3, 8, 8, 8, 2]
    assert inverse_success_group_sizes(p, 3).tolist() == [3, 2, 2, 3, 3, 3, 3, 2]


def test_fill_row_budget_by_hand():
    from trl_groupx.sampling.sgpo import fill_row_budget

    sizes = torch.tensor([0, 4, 2, 4, 2, 0, 0, 2])  # by dataset index (trivial prompts never in the order)
    order = torch.tensor([2, 7, 4, 1, 3])
    # 8 rows: 2, 7, 4 take 2 each, 2 rows left for prompt 1 (size 4): its group is cut to 2
    assert fill_row_budget(order, sizes, 0, 8) == ([2, 7, 4, 1], [2, 2, 2, 2])
    # from position 4: 3 (4 rows), wrap: 2 (2), 7 (2)
    assert fill_row_budget(order, sizes, 4, 8) == ([3, 2, 7], [4, 2, 2])
    # 7 rows from position 3: 1 (4), 3 would take 4 of 3 left → cut to 3
    assert fill_row_budget(order, sizes, 3, 7) == ([1, 3], [4, 3])
    # 5 rows from 0: 2, 7 (4 rows), one row left: it joins 7's group, prompt 4 waits
    assert fill_row_budget(order, sizes, 0, 5) == ([2, 7], [2, 3])
    with pytest.raises(ValueError, match="at least 2 rows"):
        fill_row_budget(order, sizes, 0, 1)


def test_select_with_inverse_success_returns_groups_and_advances_by_prompts():
    state = {"p_hat": _d(P_HAT), "order": torch.tensor([2, 7, 4, 1, 3]), "served": 0}
    flags = _flags(sgpo_group_size="inverse_success", num_generations=4)
    # p̂ of 2, 7, 4, 1, 3: .75, .75, .5, .25, 0 → sizes 2, 2, 2, 4, cap 4; 2 prompts × G = 8 rows per batch
    assert sgpo_select(state, 2, 8, **flags) == ([2, 7, 4, 1], [2, 2, 2, 2]) and state["served"] == 4
    assert sgpo_select(state, 2, 8, **flags) == ([3, 2, 7], [4, 2, 2]) and state["served"] == 7
    capped = {"p_hat": _d(P_HAT), "order": torch.tensor([2, 7, 4, 1, 3]), "served": 3}
    # cap 3: prompt 1 gets 3, prompt 3 gets 3, then 2 rows for prompt 2
    assert sgpo_select(capped, 2, 8, **{**flags, "sgpo_max_group_size": 3}) == ([1, 3, 2], [3, 3, 2])


def test_rollout_filter_checks_the_recorded_group_sizes():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    batch = RolloutBatch(rewards=rewards, completion_lengths=torch.ones(8), group_size=4,
                         group_sizes=torch.tensor([4, 2, 2]))
    state = {"pending": torch.tensor([3, 2, 7]), "pending_sizes": torch.tensor([4, 2, 2])}
    assert sgpo(batch, state=state).all() and "pending_sizes" not in state and state["pending"].numel() == 0
    with pytest.raises(ValueError, match=r"groups \[4, 2, 2\], but the selection recorded \[2, 2, 4\]"):
        sgpo(batch, state={"pending": torch.tensor([3, 2, 7]), "pending_sizes": torch.tensor([2, 2, 4])})


def test_group_size_flags_and_stages_that_read_fixed_groups_fail_at_construction():
    assert _config().sgpo_group_size == "inverse_success"  # the paper's rule by default
    assert trl_groupx.get_variant("sgpo").flags["sgpo_group_size"] == "inverse_success"
    for flags, match in [
        ({"sgpo_group_size": "adaptive"}, "sgpo_group_size='adaptive': use one of"),
        ({"sgpo_max_group_size": 1}, "sgpo_max_group_size=1: use an integer ≥ 2"),
        ({"sgpo_max_group_size": True}, "sgpo_max_group_size=True"),
        ({"sgpo_group_size": "fixed", "sgpo_max_group_size": 8}, "only caps sgpo_group_size='inverse_success'"),
        ({"advantage_estimator": "gpg_valid_rescale"},
         r"sgpo_group_size='inverse_success' gives prompts groups of different sizes, but "
         r"advantage_estimator='gpg_valid_rescale'.*set sgpo_group_size to its fixed-size value or drop "
         r"advantage_estimator"),
        ({"token_weighting": "gtpo_entropy"}, r"but token_weighting='gtpo_entropy' reads groups"),
        ({"loss_type": "gvpo", "beta": 0.1, "scale_rewards": "none"},
         r"but loss_type='gvpo' reads each rollout's group \(\['group_structure'\]\)"),
        ({"loss_type": "srpo"}, r"but loss_type='srpo' reads each rollout's group \(\['self_teacher_topk'\]\)"),
        ({"edge_grpo_gec": True}, "but edge_grpo_gec=True corrects responses within fixed-size groups"),
    ]:
        with pytest.raises(ValueError, match=match):
            _config(**flags)
    # with fixed groups the same combinations are fine, and a group-agnostic objective composes with variable groups
    assert _config(sgpo_group_size="fixed", advantage_estimator="gpg_valid_rescale").advantage_estimator
    assert _config(advantage_estimator="rloo").advantage_estimator == "rloo"  # group-local: runs group by group
    assert _config(loss_type="gmpo").loss_type == "gmpo"
