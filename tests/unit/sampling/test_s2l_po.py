"""S2L-PO's pure parts: the official anneal schedule (hand-computed from the driver script's loop), the generation
batch index from global_step, the all-keeping filter, the explorer vocabulary check and the config refusals."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trl_groupx.contracts import RolloutBatch
from trl_groupx.registry import get_variant
from trl_groupx.sampling.s2l_po import (
    check_explorer_vocab,
    generation_batch_index,
    is_explorer_batch,
    load_explorer,
    official_schedule,
    optimizer_steps_per_generation,
    s2l_po,
    validate,
)


def test_official_schedule_n8_hand_computed():
    # off2on_4b_8b_16_8.sh, N = 8, 16/16 samples: ratio_t = 1 − (t−1)/7
    # t=1: ratio 1      → explorer ceil(16) = 16, learner ceil(0) = 0 (no learner batch)
    # t=2: ratio 6/7    → explorer ceil(13.71) = 14, learner ceil(2.29) = 3
    # t=3: ratio 5/7    → 12 (11.43), 5 (4.57);  t=4: 4/7 → 10 (9.14), 7 (6.86);  t=5: 3/7 → 7 (6.86), 10 (9.14)
    # t=6: ratio 2/7    → 5 (4.57), 12 (11.43);  t=7: 1/7 → 3 (2.29), 14 (13.71)
    # t=8: ratio 0      → explorer ceil(0) = 0 (no explorer batch), learner 16
    expected = (("explorer", 16), ("explorer", 14), ("learner", 3), ("explorer", 12), ("learner", 5),
                ("explorer", 10), ("learner", 7), ("explorer", 7), ("learner", 10), ("explorer", 5), ("learner", 12),
                ("explorer", 3), ("learner", 14), ("learner", 16))
    assert official_schedule(8) == expected
    # the script's own arithmetic, as its shell loop runs it (python3 -c, float ratio printed and read back)
    for t, (e, lr) in zip(range(2, 8), [(14, 3), (12, 5), (10, 7), (7, 10), (5, 12), (3, 14)]):
        ratio = float(repr(1 - (t - 1) / 7))
        assert (math.ceil(ratio * 16), math.ceil((1 - float(repr(ratio))) * 16)) == (e, lr)


@pytest.mark.parametrize("k, explorer", [(0, True), (1, True), (2, False), (3, True), (4, False), (5, True),
                                         (6, False), (7, True), (8, False), (9, True), (10, False), (11, True),
                                         (12, False), (13, False), (14, False), (100, False)])
def test_explorer_batches_of_the_paper_default(k, explorer):
    # N = 8 (schedule above): explorer at batches 0, 1, 3, 5, 7, 9, 11; learner at 2, 4, ..., 12, 13 and after
    assert is_explorer_batch(k, 8) is explorer


def test_small_anneals_and_zero():
    # N = 0: no logical anneal step (the script's loop is empty): frac = 0 everywhere, plain GRPO
    assert official_schedule(0) == () and not any(is_explorer_batch(k, 0) for k in range(50))
    # N = 1: ratio 1 by definition → one explorer batch of 16, then learner only
    assert official_schedule(1) == (("explorer", 16),)
    assert [k for k in range(10) if is_explorer_batch(k, 1)] == [0]
    # N = 2: ratios 1, 0 → explorer, then learner
    assert official_schedule(2) == (("explorer", 16), ("learner", 16))
    # N = 3: ratios 1, 1/2, 0 → explorer 16; explorer 8, learner 8; learner 16
    assert official_schedule(3) == (("explorer", 16), ("explorer", 8), ("learner", 8), ("learner", 16))
    assert [k for k in range(10) if is_explorer_batch(k, 3)] == [0, 1]
    assert not is_explorer_batch(-1, 8)


def test_generation_batch_index_from_global_step():
    # TRL generates every steps_per_generation · num_iterations micro-batches and steps every gradient_accumulation
    assert optimizer_steps_per_generation(4, 1, 4) == 1  # TRL's default: one generation batch per optimizer step
    assert optimizer_steps_per_generation(4, 2, 2) == 4  # 8 micro-batches per batch, 2 per optimizer step
    assert [generation_batch_index(s, 1) for s in range(4)] == [0, 1, 2, 3]
    # 4 optimizer steps per batch: steps 0-3 train batch 0, 4-7 batch 1; a resume at step 6 is inside batch 1
    assert [generation_batch_index(s, 4) for s in (0, 3, 4, 6, 7, 8)] == [0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize("rewards", [[1.0, 0.0, float("nan"), 1.0], [1.0, 1.0, 1.0, 1.0], [0.5], [0.0, 1.0]])
def test_filter_keeps_every_rollout(rewards):
    # all-equal group, NaN reward, group size 1 and 2: nothing dropped, nothing read but the batch size
    batch = RolloutBatch(torch.tensor(rewards), torch.ones(len(rewards)), min(len(rewards), 4))
    keep = s2l_po(batch, state={})
    assert keep.dtype == torch.bool and keep.shape == (len(rewards),) and keep.all()


def _model(vocab):
    return SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: SimpleNamespace(vocab_size=vocab)))


def test_explorer_vocab_check():
    check_explorer_vocab("small", _model(151936), _model(152064))  # Qwen2.5-1.5B under Qwen2.5-7B: fine
    check_explorer_vocab("same", _model(104), _model(104))
    with pytest.raises(ValueError, match="s2l_po_explorer_model='wide' has vocab_size 108 but the policy has 104"):
        check_explorer_vocab("wide", _model(108), _model(104))


def _config(**overrides):
    values = dict(s2l_po_anneal_steps=8, s2l_po_explorer_model="some/model", use_vllm=False, steps_per_generation=4,
                  num_iterations=1, gradient_accumulation_steps=4, s2l_po_group_sizes="fixed")
    values.update(overrides)
    return SimpleNamespace(**values)


def test_validate_accepts_the_defaults_and_refuses_bad_values():
    validate(_config())
    validate(_config(s2l_po_anneal_steps=0, s2l_po_explorer_model=None))  # plain GRPO, no explorer needed
    validate(_config(steps_per_generation=2, num_iterations=2, gradient_accumulation_steps=4))  # 4 % 4 == 0
    for bad in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match="s2l_po_anneal_steps must be an integer >= 0"):
            validate(_config(s2l_po_anneal_steps=bad))
    for bad in ("", " ", 7, ["a"]):
        with pytest.raises(ValueError, match="s2l_po_explorer_model must be a model id or a local path"):
            validate(_config(s2l_po_explorer_model=bad))
    with pytest.raises(ValueError, match="use_vllm=True|Set use_vllm=False"):
        validate(_config(use_vllm=True))
    with pytest.raises(ValueError, match=r"steps_per_generation × num_iterations \(3 × 1\) must be a multiple of "
                                         r"gradient_accumulation_steps \(2\)"):
        validate(_config(steps_per_generation=3, gradient_accumulation_steps=2))


def test_registered_with_the_paper_defaults():
    variant = get_variant("s2l_po")
    assert variant.stage == "sampling" and variant.flags["s2l_po_anneal_steps"] == 8
    assert variant.flags["beta"] == 0.001  # official kl_loss_coef (low_var_kl = TRL's k3)
    assert variant.official_code.startswith("qishisuren123/S2L-PO@68607d24ce17ebe72f64d488e835f249774607e3:")
    assert set(variant.params) == {"s2l_po_explorer_model", "s2l_po_anneal_steps", "s2l_po_group_sizes"}
    assert variant.flags["s2l_po_group_sizes"] == "official" and variant.stateful


def test_load_explorer_refusals_before_loading():
    def trainer(steps=8, path="some/model", rollout_func=None, zero_stage=None):
        plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
        return SimpleNamespace(args=SimpleNamespace(s2l_po_anneal_steps=steps, s2l_po_explorer_model=path),
                               rollout_func=rollout_func, is_deepspeed_enabled=plugin is not None,
                               accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))

    assert load_explorer(trainer(steps=0, path=None)) is None  # no explorer batch: nothing loaded
    with pytest.raises(ValueError, match="s2l_po_explorer_model is not set"):
        load_explorer(trainer(path=None))
    with pytest.raises(ValueError, match="cannot redirect a rollout_func"):
        load_explorer(trainer(rollout_func=print))
    with pytest.raises(ValueError, match="cannot unwrap under DeepSpeed ZeRO-3. Use ZeRO-2, FSDP or DDP"):
        load_explorer(trainer(zero_stage=3))


def test_batch_group_size_follows_the_official_counts_scaled_to_the_group():
    from trl_groupx.sampling.s2l_po import batch_group_size

    # N = 8: explorer 16, 14, (learner 3), 12, (5), 10, (7), 7, (10), 5, (12), 3, (14), learner 16 (hand-computed above)
    counts = [n for _, n in official_schedule(8)]
    assert [batch_group_size(b, 8, 16) for b in range(len(counts))] == counts  # G = 16: the official counts
    # G = 4: ⌈n/4⌉ with a floor of 2: 16 → 4, 14 → ⌈3.5⌉ = 4, 3 → ⌈0.75⌉ = 1 → 2, 12 → 3, 5 → 2, 10 → ⌈2.5⌉ = 3, 7 → 2
    assert [batch_group_size(b, 8, 4) for b in range(7)] == [4, 4, 2, 3, 2, 3, 2]
    assert batch_group_size(99, 8, 4) == 4 and batch_group_size(0, 0, 4) == 4  # after the anneal / no anneal: G


def test_select_fills_the_rows_with_the_batch_group_size():
    from trl_groupx.sampling.s2l_po import s2l_po_select

    state = {}
    # no trainer: batch 0 (explorer 16 of 16 → G = 4): 8 rows = 2 prompts of a seeded permutation of 6 prompts
    prompts, sizes = s2l_po_select(state, 2, 6, seed=0, num_generations=4, s2l_po_anneal_steps=3)
    order = np.random.default_rng([0]).permutation(6).tolist()  # the walk's order, derived from the seed
    assert prompts == order[:2] and sizes == [4, 4] and state == {"served": 2, "dataset_size": 6}
    assert s2l_po_select(state, 2, 6, seed=0, num_generations=4, s2l_po_anneal_steps=3) == (order[2:4], [4, 4])
    with pytest.raises(ValueError, match="walked a dataset of 6 prompts but the train dataset has 7"):
        s2l_po_select(state, 2, 7, seed=0, num_generations=4, s2l_po_anneal_steps=3)


def test_official_group_sizes_refuse_stages_that_read_fixed_groups():
    import trl_groupx

    base = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="s2l_po", num_generations=4,
                per_device_train_batch_size=8, s2l_po_explorer_model="some/model")
    assert trl_groupx.GRPOConfig(**base).s2l_po_group_sizes == "official"
    with pytest.raises(ValueError, match="s2l_po_group_sizes='official' gives prompts groups of different sizes, but "
                                         "advantage_estimator='gpg_valid_rescale'"):
        trl_groupx.GRPOConfig(**base, advantage_estimator="gpg_valid_rescale")
    assert trl_groupx.GRPOConfig(**base, advantage_estimator="gpg_valid_rescale", s2l_po_group_sizes="fixed")
    assert trl_groupx.GRPOConfig(**base, advantage_estimator="rloo")  # group-local: runs group by group
    with pytest.raises(ValueError, match="s2l_po_group_sizes='random': use 'official'"):
        trl_groupx.GRPOConfig(**base, s2l_po_group_sizes="random")
