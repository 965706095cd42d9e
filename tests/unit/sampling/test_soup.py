"""SOUP's pure parts on hand-built tensors: the prefix length of a stored rollout, which slots are stored and which
mixed, the behaviour log-probs of a mixed row, the buffer's plan and update, the stage's filter, config checks."""

import copy

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.soup import mixed_behaviour_logps, mixed_slots, prefix_length, soup, stored_slots
from trl_groupx.sampling.soup_glue import _plan, _store

EOS = 9


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "soup",
            "num_generations": 4, "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


@pytest.mark.parametrize("length, eos, fraction, expected", [
    (10, True, 0.5, 4),    # 9 tokens before the EOS: ⌊4.5⌋
    (10, False, 0.5, 5),   # truncated, no EOS: ⌊5⌋
    (3, True, 0.99, 1),    # ⌊0.99 · 2⌋
    (1, True, 0.9, 0),     # the EOS alone: nothing to keep
    (0, False, 0.5, 0),    # empty completion
    (10, True, 0.0, 0),    # f = 0: never a prefix
])
def test_prefix_length_by_hand(length, eos, fraction, expected):
    assert prefix_length(length, eos, fraction) == expected


def test_slots():
    assert (stored_slots(4, 1), mixed_slots(4, 1)) == ([0], [3])
    assert (stored_slots(4, 2), mixed_slots(4, 2)) == ([0, 1], [2, 3])
    assert (stored_slots(2, 1), mixed_slots(2, 1)) == ([0], [1])  # group of two: one of each
    assert (stored_slots(1, 1), mixed_slots(1, 1)) == ([0], [0])  # group of one: the row mixes what it stored last
    assert stored_slots(4, 4) == mixed_slots(4, 4) == [0, 1, 2, 3]


def test_mixed_behaviour_logps_by_hand():
    current = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    out = mixed_behaviour_logps(current, torch.tensor([-0.5, -0.75]))
    assert out.tolist() == [-0.5, -0.75, -3.0, -4.0] and current.tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert torch.equal(mixed_behaviour_logps(current, torch.zeros(0)), current)  # empty prefix: unchanged
    with pytest.raises(ValueError, match="A stored prefix of 5 tokens does not fit a mixed row of 4 tokens"):
        mixed_behaviour_logps(current, torch.zeros(5))


def test_store_then_plan_by_hand():
    # two groups of G = 2 (keys 11, 22), k = 1, f = 0.5; completions padded with 0, masks give the lengths
    ids = torch.tensor([[1, 2, 3, 4, EOS, 0], [5, 6, 0, 0, 0, 0], [7, 8, 9, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1] * 6])
    logps = -torch.arange(24, dtype=torch.float32).view(4, 6) / 10
    buffer = {}
    assert _plan(buffer, [11, 11, 22, 22], 2, 1) == []  # first visit: nothing stored yet
    _store(buffer, [11, 11, 22, 22], ids, mask, logps, 2, 1, 0.5, {EOS})
    # group 11, slot 0: 4 tokens before the EOS → prefix [1, 2] with log-probs [-0.0, -0.1]
    # group 22, slot 0 (row 2): ids 7 8 9 end with 9 = EOS → 2 tokens before it → prefix [7]
    assert [t.tolist() for t in buffer[11]["ids"]] == [[1, 2]] and [t.tolist() for t in buffer[22]["ids"]] == [[7]]
    assert torch.allclose(buffer[11]["logps"][0], torch.tensor([0.0, -0.1]))
    assert torch.allclose(buffer[22]["logps"][0], torch.tensor([-1.2]))
    # next visit, prompts in another order: the last slot of each group mixes its prompt's prefix
    plan = _plan(buffer, [22, 22, 11, 11], 2, 1)
    assert [(row, p.tolist()) for row, p, _ in plan] == [(1, [7]), (3, [1, 2])]
    # an empty stored prefix mixes no row
    empty = copy.deepcopy(buffer)
    empty[22]["ids"][0] = torch.zeros(0, dtype=torch.int64)
    assert [row for row, _, _ in _plan(empty, [22, 22, 11, 11], 2, 1)] == [3]


def test_filter_keeps_every_rollout():
    batch = RolloutBatch(rewards=torch.tensor([1.0, float("nan"), 0.0, 0.0]), completion_lengths=torch.ones(4),
                         group_size=2)
    assert soup(batch, state={}).tolist() == [True] * 4
    with pytest.raises(ValueError, match="rollout_filter='soup' got an infinite reward"):
        soup(RolloutBatch(torch.tensor([float("inf"), 0.0]), torch.ones(2), 2), state={})


def test_registry_defaults_and_bad_flags_fail_at_construction():
    config = _config()
    assert (config.soup_mixed_rollouts, config.soup_prefix_fraction) == (1, 0.5)
    for flags, match in [
        ({"soup_mixed_rollouts": 0}, r"soup_mixed_rollouts=0: use an integer in \[1, num_generations=4\]"),
        ({"soup_mixed_rollouts": 5}, "soup_mixed_rollouts=5"),
        ({"soup_mixed_rollouts": True}, "soup_mixed_rollouts=True"),
        ({"soup_prefix_fraction": 1.0}, r"soup_prefix_fraction=1.0: use a fraction in \[0, 1\)"),
        ({"soup_prefix_fraction": -0.1}, "soup_prefix_fraction=-0.1"),
        ({"soup_prefix_fraction": float("nan")}, "soup_prefix_fraction=nan"),
        ({"edge_grpo_gec": True}, "both rewrite rollouts after generation"),
    ]:
        with pytest.raises(ValueError, match=match):
            _config(**flags)
    with pytest.raises(ValueError, match="soup_prefix_fraction=0.3 belongs to variant 'soup', which is not switched on"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, soup_prefix_fraction=0.3)
