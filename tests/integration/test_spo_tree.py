"""SPO-tree (`token_weighting="spo_segment"`, `spo_segment_mode="tree"`) on the tiny model: each group is grown as the
leaf paths of a 2-2-1 tree of 3-token segments (slots sharing a node share its tokens, or copy a leaf's response),
in the batch's own generation (TRL's call on the spines only), every row is scored as it stands, the node values sit
at the segment boundaries, the gradient changes
against plain GRPO (full and LoRA), and two processes grow the same trees when a group spans both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, generate_first_batch, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.sampling._scoring import as_completions
from trl_groupx.token_weights.spo_tree import node_values
from trl_groupx.token_weights.spo_tree_rollouts import tree_values

M = 3  # tokens per segment; conftest: num_generations 4 → default branching [2, 2, 1]
FLAGS = dict(token_weighting="spo_segment", spo_segment_mode="tree", spo_segment_tree_segment_length=M,
             max_completion_length=12, temperature=1.5)


def tree_trainer(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **{**FLAGS, **flags})


def responses(output):
    return [ids[: int(m.sum())].tolist() for ids, m in zip(output["completion_ids"], output["completion_mask"])]


def test_groups_are_grown_as_tree_paths_and_scored(tmp_path):
    trainer = tree_trainer(tmp_path)
    generated, generate_rows = [], trainer._generate_rows

    def recording(prompt_ids, *args):
        generated.append(len(prompt_ids))
        return generate_rows(prompt_ids, *args)

    trainer._generate_rows = recording
    rows, output = generate_first_batch(trainer)
    paths = responses(output)
    continued = copied = 0
    for g in range(len(paths) // 4):
        spine_a, slot_b, spine_c, slot_d = paths[4 * g: 4 * g + 4]
        # 2-2-1: slots 0 and 2 are sampled from the prompt; slot 1 continues slot 0's first segment, slot 3 slot 2's
        for spine, slot in ((spine_a, slot_b), (spine_c, slot_d)):
            if len(spine) > M:  # the depth-0 node has children: the first M tokens are shared
                assert slot[:M] == spine[:M] and len(slot) > M
                continued += 1
            else:  # the depth-0 node ended the response: a leaf, copied
                assert slot == spine
                copied += 1
    assert continued > 0
    # TRL's call: the 2 depth-0 spines of each of the 2 groups; then one call of this process's 8 rows (padded) for
    # the depth-1 continuations; depth 2 (one child each) continues nothing, so no third call
    assert generated[0] == 4 and generated[1:] == [8]
    metrics = trainer._metrics["train"]
    assert metrics["groupx/spo_tree_continued_rows"][-1] == continued
    assert metrics["groupx/spo_tree_leaf_copies"][-1] == copied
    # every row's reward is the run's reward of the row as it now stands
    rescored = parity_reward(as_completions(trainer, [r["prompt"] for r in rows], paths))
    assert trainer._rewards_per_func[:, 0].tolist() == rescored


def test_node_values_sit_at_the_segment_boundaries(tmp_path):
    trainer = tree_trainer(tmp_path)
    _, output = generate_first_batch(trainer)
    values, multiplicity = tree_values(trainer, output)
    assert multiplicity[0, :M].tolist() == [2.0] * M and (multiplicity[:, M:] == 1).all()  # 2-2-1
    rewards = trainer._rewards_per_func[:, 0].cpu()
    lengths = output["completion_mask"].sum(-1)
    for g in range(rewards.numel() // 4):
        for node in (0, 2):  # the depth-0 nodes of the group: slots node, node + 1
            row = 4 * g + node
            v = rewards[row: row + 2].mean()
            for r in (row, row + 1):
                assert (values[r, M] == v) if lengths[r] > M else values[r, M].isnan()
    # 2-2-1: a depth-1 node has one slot, its value is that row's reward, at position 2M when the response goes on
    for r in range(rewards.numel()):
        assert (values[r, 2 * M] == rewards[r]) if lengths[r] > 2 * M else values[r, 2 * M].isnan()
    off_cut = values.clone()
    off_cut[:, [M, 2 * M]] = float("nan")
    assert off_cut.isnan().all()
    assert torch.equal(values.cpu().isnan(), node_values(rewards, lengths.cpu(), [2, 2, 1], M,
                                                         values.shape[1]).isnan())


@pytest.mark.parametrize("peft", [False, True])
def test_tree_changes_the_gradient_against_grpo(tmp_path, peft):
    plain = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "grpo", peft=peft,
                          max_completion_length=12, temperature=1.5)
    _, base, _ = one_step(plain)
    loss, grads, inputs = one_step(tree_trainer(tmp_path / "tree", peft))
    assert torch.isfinite(loss) and inputs["advantages"].dim() == 2  # per-token segment advantages
    assert grads_differ(base, grads)


def test_composes_with_an_objective(tmp_path):
    loss, grads, _ = one_step(tree_trainer(tmp_path, loss_type="dapo", epsilon_high=0.28))
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())


@needs_torchrun
def test_two_processes_grow_the_same_trees(tmp_path):
    launch(Path(__file__).with_name("spo_tree_mp_worker.py"), tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree"] and result["tree_paths"] and result["continued"] > 0, result
    assert results[0]["paths"] == results[1]["paths"]
