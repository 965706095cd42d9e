"""SPO (spo_single): one real step on the tiny model (full and LoRA) changes the gradient against plain GRPO with
exactly the advantages the tracker gives for the trainer's rewards and prompt keys; composes with GMPO; two steps
over the same prompts update the tracker; a resumed run continues exactly (weights and tracker)."""

import json
from pathlib import Path

import pytest
import torch
from datasets import concatenate_datasets

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.advantages import _prompt_keys
from trl_groupx.advantages._prompt_keys import prompt_keys_from_ids
from trl_groupx.advantages.spo_single import spo_single_advantages
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.fixture
def calls(monkeypatch):
    """Spy on the keys the trainer computes: records (prompt_keys, rewards) of every advantage call, global order."""
    recorded, real = [], _prompt_keys.prompt_keys_from_ids

    def spy(ids, mask):
        keys = real(ids, mask)
        recorded.append(keys)
        return keys

    monkeypatch.setattr(_prompt_keys, "prompt_keys_from_ids", spy)
    return recorded


def _pairs(keys, advantages):
    return sorted(zip(keys.tolist(), [round(a, 5) for a in advantages.tolist()]))


@pytest.mark.parametrize("peft", [False, True])
def test_spo_single_changes_gradient_with_exact_advantages(tmp_path, peft, calls):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft))
    trainer = ours(tmp_path / "spo", peft, advantage_estimator="spo_single")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    (keys,) = calls
    assert keys.shape == (8,) and (keys.view(2, 4) == keys.view(2, 4)[:, :1]).all()  # one key per group
    assert keys[0] != keys[4]
    rewards = trainer._rewards_per_func[:, 0]
    expected = spo_single_advantages(rewards, 4, prompt_keys=keys, state={})  # first step: prior v̂ = 0.5
    # TRL shuffles rows: match (prompt key, advantage) pairs, keys recomputed from the rows the loss sees
    row_keys = prompt_keys_from_ids(inputs["prompt_ids"], inputs["prompt_mask"])
    assert _pairs(row_keys, inputs["advantages"]) == _pairs(keys, expected)
    state = trainer.variant_state["spo_single"]
    assert torch.equal(state["keys"], torch.unique(keys))
    sums = torch.stack([rewards[:4].sum(), rewards[4:].sum()]).double()[torch.argsort(keys[[0, 4]])]
    torch.testing.assert_close(state["values"][:, 0], 0.875 * 0.5 + sums)
    torch.testing.assert_close(state["values"][:, 1], 0.875 * 0.5 + 4 - sums)
    assert grads_differ(base_grads, grads)


def test_spo_single_composes_with_gmpo_objective(tmp_path, calls):
    trainer = ours(tmp_path, loss_type="gmpo", advantage_estimator="spo_single", spo_single_batch_norm=False)
    _, grads, inputs = one_step(trainer)
    expected = spo_single_advantages(trainer._rewards_per_func[:, 0], 4, prompt_keys=calls[0],
                                     spo_single_batch_norm=False, state={})
    row_keys = prompt_keys_from_ids(inputs["prompt_ids"], inputs["prompt_mask"])
    assert _pairs(row_keys, inputs["advantages"]) == _pairs(calls[0], expected)
    assert all(torch.isfinite(g).all() for g in grads.values())


def _run(path, **overrides):
    # two prompts, two per step: every step revisits both, so the tracker moves from the second step on
    settings = {"advantage_estimator": "spo_single", "dataset": arithmetic_dataset(2, seed=0), "max_steps": 3,
                "save_strategy": "steps", "save_steps": 1}
    return ours(path, **{**settings, **overrides})


def test_two_steps_over_the_same_prompts_update_the_tracker(tmp_path, monkeypatch):
    recorded, real = [], _prompt_keys.prompt_keys_from_ids
    trainer = _run(tmp_path, max_steps=2, save_strategy="no")

    def spy(ids, mask):
        keys = real(ids, mask)
        recorded.append((keys, trainer._rewards_per_func[:, 0].clone()))  # rewards of this very batch
        return keys

    monkeypatch.setattr(_prompt_keys, "prompt_keys_from_ids", spy)
    trainer.train()
    assert len(recorded) == 2
    assert set(recorded[0][0].tolist()) == set(recorded[1][0].tolist())  # same two prompts both steps
    replay = {}
    for keys, rewards in recorded:
        spo_single_advantages(rewards, 4, prompt_keys=keys, state=replay)
    state = trainer.variant_state["spo_single"]
    assert torch.equal(state["keys"], replay["keys"]) and torch.equal(state["values"], replay["values"])
    # two visits: α + β = ρ(ρ·1 + 4) + 4 for each prompt
    torch.testing.assert_close(state["values"].sum(1), torch.full((2,), 0.875 * (0.875 + 4) + 4, dtype=torch.float64))


def test_spo_single_resume_continues_exactly(tmp_path):
    # the two prompts repeated three times: the three steps stay in one epoch (HF's resume replays the epoch's
    # sampler only within an epoch) and every step revisits prompts already in the tracker
    data = concatenate_datasets([arithmetic_dataset(2, seed=0)] * 3)
    full = _run(tmp_path / "full", dataset=data)
    full.train()
    state = full.variant_state["spo_single"]
    assert state["keys"].shape == (2,)
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert torch.equal(saved["spo_single"]["keys"], state["keys"])
    # counts after two steps of 8 scored rollouts over two prompts: Σ(α + β) = 2·ρ·0.5 decayed per visit + 16 > 16
    assert saved["spo_single"]["values"].sum() > 16 and not torch.equal(saved["spo_single"]["values"], state["values"])

    resumed = _run(tmp_path / "resumed", dataset=data)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    other = resumed.variant_state["spo_single"]
    assert torch.equal(other["keys"], state["keys"]) and torch.equal(other["values"], state["values"])
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_share_keys_and_tracker(tmp_path):
    worker = Path(__file__).with_name("spo_single_mp_worker.py")
    launch(worker, tmp_path, timeout=600)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.jsonl").read_text())
        assert result["keys_agree_within_group"], result  # hashes agree across processes (not Python's hash())
        assert result["matches_formula"] and result["matches_replay"], result
        assert result["ranks_agree_on_state"] and result["num_prompts"] >= 1, result
