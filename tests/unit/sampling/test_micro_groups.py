"""Micro sampling groups (`generation_micro_group_size`): chunk bounds, reassembly order, multimodal slicing and the
config-time checks. TRL's generation is replaced by a recording stand-in here; the real model is exercised in
`tests/integration/test_micro_groups.py`."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
import trl
from accelerate.utils import DistributedType

import trl_groupx
from trl_groupx.sampling.micro_groups import chunk_bounds, generate_in_micro_groups


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "num_generations": 4,
            "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


def _trainer(k, distributed=DistributedType.NO, tools=None):
    return SimpleNamespace(args=SimpleNamespace(generation_micro_group_size=k),
                           accelerator=SimpleNamespace(distributed_type=distributed), tools=tools,
                           environment_factories=None)


class RecordingGenerate:
    """Stands in for TRL's `_generate_single_turn`: completion of row r = [first prompt token of r, 2 (EOS)];
    records every call's arguments."""

    def __init__(self, with_logprobs=False):
        self.calls = []
        self.with_logprobs = with_logprobs

    def __call__(self, prompt_ids, images, fields, num_generations, has_tool_images=False):
        self.calls.append({"prompt_ids": prompt_ids, "images": images, "fields": fields, "n": num_generations,
                           "tool_images": has_tool_images})
        completions = [[p[0], 2] for p in prompt_ids]
        logprobs = [[-float(p[0]), -0.5] for p in prompt_ids] if self.with_logprobs else None
        return completions, logprobs


def test_chunk_bounds_hand_cases():
    # 8 rows, k=3 -> [0,3) [3,6) [6,8); k divides -> equal chunks; k=1 -> one row each; k >= rows -> one chunk
    assert chunk_bounds(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert chunk_bounds(8, 4) == [(0, 4), (4, 8)]
    assert chunk_bounds(3, 1) == [(0, 1), (1, 2), (2, 3)]
    assert chunk_bounds(5, 9) == [(0, 5)]


@pytest.mark.parametrize("k, sizes", [(1, [1] * 7), (2, [2, 2, 2, 1]), (3, [3, 3, 1]), (7, [7]), (50, [7])])
def test_rows_are_chunked_and_reassembled_in_order(k, sizes):
    prompts = [[10 + r, 5, 6][: 1 + r % 3] for r in range(7)]  # ragged prompts, first token identifies the row
    gen = RecordingGenerate()
    completions, logprobs = generate_in_micro_groups(_trainer(k), gen, prompts, None, {}, 4, True)
    assert [len(c["prompt_ids"]) for c in gen.calls] == sizes
    assert [p for c in gen.calls for p in c["prompt_ids"]] == prompts  # every row once, in order, unchanged
    assert completions == [[10 + r, 2] for r in range(7)]
    assert logprobs is None
    assert all(c["n"] == 4 and c["tool_images"] is True and c["fields"] == {} for c in gen.calls)


def test_logprobs_and_images_follow_their_rows():
    prompts = [[20 + r] for r in range(5)]
    images = [[f"img{r}"] if r % 2 else None for r in range(5)]
    gen = RecordingGenerate(with_logprobs=True)
    completions, logprobs = generate_in_micro_groups(_trainer(2), gen, prompts, images, {}, 1)
    assert [c["images"] for c in gen.calls] == [[None, ["img1"]], [None, ["img3"]], [None]]
    assert logprobs == [[-20.0 - r, -0.5] for r in range(5)]
    assert completions == [[20 + r, 2] for r in range(5)]


def test_qwen_vl_style_fields_are_split_per_row():
    # Qwen-VL layout: pixel_values flattened over patches (grid t*h*w rows per image), image_grid_thw per image,
    # one image per prompt except row 2 (two images). Patch p of image i holds the value 100*i + p.
    grids = [(1, 2, 2), (1, 1, 2), (1, 2, 1), (1, 1, 1), (1, 2, 2)]  # images 0..4; row 2 owns images 2 and 3
    per_image = [torch.full((t * h * w, 3), 100.0 * i) + torch.arange(t * h * w)[:, None] for i, (t, h, w) in
                 enumerate(grids)]
    fields = {"pixel_values": torch.cat(per_image), "image_grid_thw": torch.tensor(grids),
              "token_type_ids": [[0, 1], [0, 1, 1], [1], [0, 0, 1]]}
    images = [["a"], ["b"], ["c", "d"], ["e"]]
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8, 9]]
    gen = RecordingGenerate()
    generate_in_micro_groups(_trainer(2), gen, prompts, images, fields, 1)
    first, second = (c["fields"] for c in gen.calls)
    assert torch.equal(first["pixel_values"], torch.cat(per_image[:2]))  # rows 0-1: images 0, 1
    assert torch.equal(first["image_grid_thw"], torch.tensor(grids[:2]))
    assert first["token_type_ids"] == [[0, 1], [0, 1, 1]]
    assert torch.equal(second["pixel_values"], torch.cat(per_image[2:]))  # rows 2-3: images 2, 3 and 4
    assert torch.equal(second["image_grid_thw"], torch.tensor(grids[2:]))
    assert second["token_type_ids"] == [[1], [0, 0, 1]]
    assert "num_images" not in first and "num_images" not in second  # added for splitting only, as TRL does


def test_field_without_one_entry_per_row_is_refused():
    gen = RecordingGenerate()
    with pytest.raises(ValueError, match="generation_micro_group_size.*'image_sizes'.*2 entries for 3 prompts"):
        generate_in_micro_groups(_trainer(1), gen, [[1], [2], [3]], None, {"image_sizes": torch.ones(2, 2)}, 1)
    assert gen.calls == []


def test_one_chunk_is_the_plain_call_even_under_sharding_with_tools():
    gen = RecordingGenerate()
    trainer = _trainer(4, DistributedType.DEEPSPEED, tools=[print])
    fields = {"anything": object()}  # passed through untouched: no splitting when one chunk covers all rows
    generate_in_micro_groups(trainer, gen, [[1], [2]], None, fields, 2)
    assert gen.calls[0]["fields"] is fields


def test_sharded_tool_loop_is_refused():
    with pytest.raises(ValueError, match="generation_micro_group_size with DeepSpeed/FSDP and tools"):
        generate_in_micro_groups(_trainer(1, DistributedType.FSDP, tools=[print]), RecordingGenerate(),
                                 [[1], [2]], None, {}, 1)


def test_trl_method_signature_is_the_one_overridden():
    params = list(inspect.signature(trl.GRPOTrainer._generate_single_turn).parameters)
    assert params == ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"]


# ---- config --------------------------------------------------------------------------------------------------------


def test_default_is_off():
    assert _config().generation_micro_group_size is None
    assert _config(generation_micro_group_size=3).generation_micro_group_size == 3


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match=f"generation_micro_group_size={bad!r} must be a positive integer"):
        _config(generation_micro_group_size=bad)


def test_vllm_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="use_vllm=True.*Unset generation_micro_group_size"):
        _config(generation_micro_group_size=4, use_vllm=True)


def test_continuous_batching_is_refused():
    with pytest.raises(ValueError, match="use_transformers_continuous_batching=True"):
        _config(generation_micro_group_size=4, use_transformers_continuous_batching=True)
