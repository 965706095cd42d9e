"""DAPO dynamic sampling with refill: group selection, merge helpers, refill source, config checks."""

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.dapo_dynamic_sampling import (
    assign_groups,
    dapo_dynamic_sampling,
    draw_refill_indices,
    group_rows,
    merge_outputs,
    merge_rows,
    mixed_groups,
    pad_to_width,
    select_groups,
    weighted_rewards,
)
from trl_groupx.sampling.zero_variance_filter import zero_variance_filter

NAN = float("nan")


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "dapo_dynamic_sampling",
            "num_generations": 4, "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


# ---- group selection ---------------------------------------------------------------------------------------------


def test_mixed_groups_hand_cases():
    # G = 4: [1,1,1,1] all equal -> drop; [1,0,1,0] mixed -> keep; [0,0,0,0] -> drop;
    # [1,NaN,1,1] scored all equal -> drop; [1,NaN,0,NaN] scored differ -> keep; all NaN -> drop
    r = torch.tensor([1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, NAN, 1, 1, 1, NAN, 0, NAN, NAN, NAN, NAN, NAN])
    assert mixed_groups(r, 4).tolist() == [False, True, False, False, True, False]


def test_mixed_groups_small_groups():
    # G = 2: [0.5, 0.5] equal -> drop, [0.5, 0.25] -> keep, [NaN, 1] one scored -> drop
    assert mixed_groups(torch.tensor([0.5, 0.5, 0.5, 0.25, NAN, 1.0]), 2).tolist() == [False, True, False]
    # G = 1: verl keeps single-trajectory groups (nothing to compare); unscored ones are dropped
    assert mixed_groups(torch.tensor([1.0, NAN, 0.0]), 1).tolist() == [True, False, True]


def test_mixed_groups_rejects_inf():
    with pytest.raises(ValueError, match="dapo_dynamic_sampling.*inf"):
        mixed_groups(torch.tensor([1.0, float("inf"), 0.0, 0.0]), 2)
    with pytest.raises(ValueError, match="dapo_dynamic_sampling.*inf"):
        dapo_dynamic_sampling(RolloutBatch(torch.tensor([-float("inf"), 0.0]), None, 2), state={})


def test_filter_equals_zero_variance_filter():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, NAN, 3.0])
    batch = RolloutBatch(r, torch.ones(8), 2)
    # groups: [1,1] drop, [0,1] keep, [2,2] drop, [NaN,3] drop
    keep = dapo_dynamic_sampling(batch, dapo_max_gen_batches=10, state={})
    assert torch.equal(keep, zero_variance_filter(batch))
    assert keep.tolist() == [False, False, True, True, False, False, False, False]


def test_weighted_rewards():
    # rows: (1, 2)·(1, 0.5) = 2; (NaN, 2) -> nansum 1; (NaN, NaN) -> NaN (unscored)
    rpf = torch.tensor([[1.0, 2.0], [NAN, 2.0], [NAN, NAN]])
    out = weighted_rewards(rpf, torch.tensor([1.0, 0.5]))
    assert out[:2].tolist() == [2.0, 1.0] and torch.isnan(out[2])


def test_assign_and_select_groups_two_processes():
    kept, dropped = [[], []], [[], []]
    # call 0: 2 processes x 2 groups; global group mask in process order: p0 = [keep, drop], p1 = [drop, drop]
    assign_groups(kept, dropped, torch.tensor([True, False, False, False]), 0, 2)
    assert kept == [[(0, 0)], []] and dropped == [[(0, 1)], [(0, 0), (0, 1)]]
    # call 1: p0 = [keep, keep], p1 = [drop, keep]
    assign_groups(kept, dropped, torch.tensor([True, True, False, True]), 1, 2)
    assert kept == [[(0, 0), (1, 0), (1, 1)], [(1, 1)]]
    # p0 is over-full: the first 2 kept in generation order (verl truncates the tail)
    assert select_groups(kept[0], dropped[0], 2) == [(0, 0), (1, 0)]
    # p1 has one kept group (cap hit): filled with its earliest dropped group
    assert select_groups(kept[1], dropped[1], 2) == [(1, 1), (0, 0)]
    assert group_rows([(1, 1), (0, 0)], 2) == [(1, 2), (1, 3), (0, 0), (0, 1)]


# ---- merge helpers -----------------------------------------------------------------------------------------------


def test_pad_to_width_sides():
    x = torch.tensor([[1, 2], [3, 4]])
    assert pad_to_width(x, 4, "left", 9).tolist() == [[9, 9, 1, 2], [9, 9, 3, 4]]
    assert pad_to_width(x, 3, "right", 0).tolist() == [[1, 2, 0], [3, 4, 0]]
    assert pad_to_width(x, 2, "right", 0) is x  # already wide enough: untouched


def test_merge_rows_order_and_padding():
    a = torch.tensor([[1, 1], [2, 2]])
    b = torch.tensor([[3, 3, 3], [4, 4, 4]])
    # rows b1, a0: a padded to width 3 on the chosen side
    assert merge_rows([a, b], [(1, 1), (0, 0)], "left", 0).tolist() == [[4, 4, 4], [0, 1, 1]]
    assert merge_rows([a, b], [(1, 1), (0, 0)], "right", -1).tolist() == [[4, 4, 4], [1, 1, -1]]
    # 1-D pieces (advantages) are just indexed
    assert merge_rows([torch.tensor([0.5, -0.5]), torch.tensor([1.0, 2.0])], [(0, 1), (1, 0)], "right", 0).tolist() \
        == [-0.5, 1.0]


def test_merge_outputs_left_prompts_right_completions():
    pad = 7
    piece0 = {  # prompt width 2, completion width 3
        "prompt_ids": torch.tensor([[pad, 5], [4, 5]]), "prompt_mask": torch.tensor([[0, 1], [1, 1]]),
        "completion_ids": torch.tensor([[1, 2, pad], [1, 2, 3]]), "completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
        "old_per_token_logps": torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -2.0, -3.0]]),
        "advantages": torch.tensor([1.0, -1.0]), "num_items_in_batch": torch.tensor(5),
    }
    piece1 = {  # prompt width 3, completion width 1
        "prompt_ids": torch.tensor([[1, 2, 3], [pad, 2, 3]]), "prompt_mask": torch.tensor([[1, 1, 1], [0, 1, 1]]),
        "completion_ids": torch.tensor([[9], [8]]), "completion_mask": torch.tensor([[1], [1]]),
        "old_per_token_logps": torch.tensor([[-0.5], [-0.25]]),
        "advantages": torch.tensor([0.5, -0.5]), "num_items_in_batch": torch.tensor(2),
    }
    merged = merge_outputs([piece0, piece1], [(1, 0), (0, 0)], pad_token_id=pad)
    assert "num_items_in_batch" not in merged  # recomputed by the caller
    assert merged["prompt_ids"].tolist() == [[1, 2, 3], [pad, pad, 5]]  # left padded to width 3
    assert merged["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert merged["completion_ids"].tolist() == [[9, pad, pad], [1, 2, pad]]  # right padded to width 3
    assert merged["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 0]]
    assert merged["old_per_token_logps"].tolist() == [[-0.5, 0.0, 0.0], [-1.0, -2.0, 0.0]]
    assert merged["advantages"].tolist() == [0.5, 1.0]
    # the merged prompt + completion of each row is its original sequence, padding aside
    full = torch.cat([merged["prompt_ids"], merged["completion_ids"]], 1)
    mask = torch.cat([merged["prompt_mask"], merged["completion_mask"]], 1).bool()
    assert full[0][mask[0]].tolist() == [1, 2, 3, 9] and full[1][mask[1]].tolist() == [5, 1, 2]


def test_merge_outputs_refuses_unknown_and_mismatched_keys():
    base = {"completion_ids": torch.zeros(1, 1), "advantages": torch.zeros(1)}
    with pytest.raises(NotImplementedError, match="pixel_values"):
        merge_outputs([{**base, "pixel_values": torch.zeros(1, 3)}] * 2, [(0, 0)], 0)
    with pytest.raises(ValueError, match="differ in keys"):
        merge_outputs([base, {**base, "tool_mask": torch.ones(1, 1)}], [(0, 0)], 0)


def test_tool_mask_padded_with_one_like_trl():
    p0 = {"tool_mask": torch.tensor([[1, 0]]), "completion_mask": torch.tensor([[1, 1]])}
    p1 = {"tool_mask": torch.tensor([[1]]), "completion_mask": torch.tensor([[1]])}
    merged = merge_outputs([p0, p1], [(1, 0)], 0)
    assert merged["tool_mask"].tolist() == [[1, 1]] and merged["completion_mask"].tolist() == [[1, 0]]


# ---- refill source -----------------------------------------------------------------------------------------------


def test_refill_source_is_a_seeded_permutation_per_epoch():
    state = {}
    first = draw_refill_indices(state, 5, 3, seed=0)
    assert state == {"epoch": 0, "position": 3}
    second = draw_refill_indices(state, 5, 4, seed=0)  # 2 left in epoch 0, then 2 of epoch 1
    assert state == {"epoch": 1, "position": 2}
    perm0 = torch.randperm(5, generator=torch.Generator().manual_seed(0 + 104729)).tolist()
    perm1 = torch.randperm(5, generator=torch.Generator().manual_seed(0 + 2 * 104729)).tolist()
    assert first == perm0[:3] and second == perm0[3:] + perm1[:2]
    assert sorted(first + second[:2]) == list(range(5))  # an epoch visits every row once


def test_refill_source_resumes_exactly_from_its_state():
    uninterrupted = {}
    draws = [draw_refill_indices(uninterrupted, 7, 3, seed=5) for _ in range(4)]
    state = {}
    draw_refill_indices(state, 7, 3, seed=5)
    saved = {k: int(v) for k, v in state.items()}  # what a checkpoint holds
    resumed = dict(saved)
    assert [draw_refill_indices(resumed, 7, 3, seed=5) for _ in range(3)] == draws[1:]
    assert resumed == uninterrupted


def test_refill_source_differs_from_trls_sampler_order():
    # TRL's RepeatSampler permutes with a generator seeded `seed`; the refill source must not replay it
    trl_order = torch.randperm(64, generator=torch.Generator().manual_seed(0)).tolist()
    assert draw_refill_indices({}, 64, 64, seed=0) != trl_order


def test_refill_source_rejects_empty_dataset():
    with pytest.raises(ValueError, match="non-empty"):
        draw_refill_indices({}, 0, 2, seed=0)


# ---- config ------------------------------------------------------------------------------------------------------


def test_flags_and_defaults():
    variant = trl_groupx.get_variant("dapo_dynamic_sampling")
    assert variant.stage == "sampling" and variant.stateful and variant.params == ("dapo_max_gen_batches",)
    assert variant.flags == {"rollout_filter": "dapo_dynamic_sampling", "dapo_max_gen_batches": 10}
    assert _config().dapo_max_gen_batches == 10  # verl DAPO script: max_num_gen_batches=10


def test_config_rejects_groups_split_across_local_batches():
    # Only reachable with several processes (TRL already requires the GLOBAL generation batch to hold whole
    # groups): 2 processes x 2 rollouts with G = 4 would split every group; the hook sees a config like this one.
    from types import SimpleNamespace

    from trl_groupx.sampling.dapo_dynamic_sampling import validate

    bad = SimpleNamespace(dapo_max_gen_batches=10, per_device_train_batch_size=2, steps_per_generation=1,
                          num_generations=4)
    with pytest.raises(ValueError, match="per_device_train_batch_size × steps_per_generation.*num_generations"):
        validate(bad)
    validate(SimpleNamespace(**{**vars(bad), "steps_per_generation": 2}))  # 2 x 2 = 4: fine
    _config(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=4)


def test_config_rejects_negative_cap_and_orphan_flag():
    with pytest.raises(ValueError, match="dapo_max_gen_batches"):
        _config(dapo_max_gen_batches=-1)
    with pytest.raises(ValueError, match="dapo_max_gen_batches"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, dapo_max_gen_batches=3)
