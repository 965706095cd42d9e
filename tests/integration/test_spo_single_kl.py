"""SPO with the KL-adaptive ρ (spo_single_rho_mode="kl") on the tiny model: the trainer stores each prompt's last
response with its log-probs under the policy of that visit, the second visit's D equals an independent re-score of
the stored response by the current model, the tracker decays with ρ = clip(2^(−D/h)) (full and LoRA), and a resumed
run continues exactly (store and tracker saved with the checkpoint); two processes hold the same store and D."""

import copy
import json
from pathlib import Path

import pytest
import torch
from datasets import concatenate_datasets

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.advantages import prompt_kl as prompt_kl_module
from trl_groupx.advantages.spo_single import spo_single_advantages
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

STORE = "spo_single/prompt_kl"
# No clip and h sized to the tiny model's drift, so that the tracker shows ρ = 2^(−D/h) itself, not a clip: one step
# at lr 1e-3 moves the full model by D ≈ 1-1.5 and the LoRA model by D ≈ 0.03 (the official h = 0.06 and clip
# [0.875, 0.96] would give the lower clip, or nearly the upper one).
HALF_LIFE = {False: 1.0, True: 0.02}  # by peft
KL_FLAGS = {"advantage_estimator": "spo_single", "spo_single_rho_mode": "kl", "spo_single_rho_min": 0.0,
            "spo_single_rho_max": 1.0, "spo_single_kl_half_life": HALF_LIFE[False]}


def independent_logps(trainer, entry) -> torch.Tensor:
    """Log-probs of one stored completion under `trainer.model`: one unpadded row, logits / temperature."""
    prompt, completion = entry["prompt_ids"], entry["completion_ids"]
    ids = torch.cat([prompt, completion]).unsqueeze(0).to(trainer.accelerator.device)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids).logits[0, prompt.numel() - 1 : -1].float() / trainer.temperature
    return logits.log_softmax(-1).gather(-1, completion.unsqueeze(-1).to(logits.device)).squeeze(-1).cpu()


def independent_d(trainer, entry) -> float:
    mask = entry["completion_mask"].bool()
    return (entry["logps"] - independent_logps(trainer, entry))[mask].abs().mean().item()


@pytest.fixture
def spy(monkeypatch):
    """Records, per call of the trainer's prompt_kl computation: the keys, rewards, the store before the call, D
    recomputed independently from it, the D the trainer passes, and the store after the call."""
    records, real = [], prompt_kl_module.compute_prompt_kl

    def wrapper(trainer, output, keys, rewards, store):
        before = copy.deepcopy(store)
        expected = {k: independent_d(trainer, before[k]) for k in set(keys.tolist()) if k in before}
        d = real(trainer, output, keys, rewards, store)
        fresh = {k: (store[k], independent_logps(trainer, store[k])) for k in set(keys.tolist()) if k in store}
        records.append({"keys": keys.clone(), "rewards": rewards.clone(), "before": before, "expected": expected,
                        "d": d.clone(), "fresh": fresh})
        return d

    monkeypatch.setattr(prompt_kl_module, "compute_prompt_kl", wrapper)
    return records


@pytest.mark.parametrize("peft", [False, True])
def test_second_visit_rho_comes_from_the_stored_response(tmp_path, spy, peft):
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                            dataset=arithmetic_dataset(2, seed=0), max_steps=2,
                            **{**KL_FLAGS, "spo_single_kl_half_life": HALF_LIFE[peft]})
    trainer.train()
    first, second = spy
    # first visit: nothing stored → D NaN (ρ = ρ_max); one entry per prompt stored, with the log-probs of the policy
    # that generated the batch (re-scored here by the same, not yet updated, weights)
    assert first["before"] == {} and torch.isnan(first["d"]).all()
    assert set(first["fresh"]) == set(first["keys"].tolist()) and len(first["fresh"]) == 2
    for entry, logps in first["fresh"].values():
        torch.testing.assert_close(entry["logps"], logps, atol=1e-5, rtol=0)
    # second visit (same two prompts): D per row = independent re-score of the stored response by the updated model
    keys = second["keys"]
    assert set(keys.tolist()) == set(first["keys"].tolist())
    expected_d = torch.tensor([second["expected"][k] for k in keys.tolist()], dtype=torch.float64)
    torch.testing.assert_close(second["d"], expected_d, atol=1e-6, rtol=1e-4)
    assert (expected_d > 1e-5).all()  # the update moved the policy: ρ < 1
    # the tracker: prior 0.5/0.5 decayed by ρ_max = 1 at the first visit, then by 2^(−D/h) at the second
    state = trainer.variant_state["spo_single"]
    replay = {}
    for record, d in ((first, first["d"]), (second, expected_d)):
        spo_single_advantages(record["rewards"], 4, prompt_keys=record["keys"], prompt_kl=d, state=replay,
                              spo_single_rho_mode="kl", spo_single_rho_min=0.0, spo_single_rho_max=1.0,
                              spo_single_kl_half_life=HALF_LIFE[peft])
    assert torch.equal(state["keys"], replay["keys"])
    torch.testing.assert_close(state["values"], replay["values"], atol=1e-5, rtol=0)
    for key, alpha_beta in zip(state["keys"].tolist(), state["values"]):
        rho = 2 ** (-second["expected"][key] / HALF_LIFE[peft])
        n1 = (first["keys"] == key).sum().item()  # scored rollouts of the prompt per visit (parity reward: all)
        n2 = (keys == key).sum().item()
        # α + β: (0.5 + 0.5)·1 + n1 after the first visit, then ρ·(1 + n1) + n2
        assert alpha_beta.sum().item() == pytest.approx(rho * (1 + n1) + n2, abs=1e-4)
        assert 0.01 < rho < 0.97  # a real decay, neither 0 nor 1


def test_constant_mode_stores_nothing(tmp_path, spy):
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path,
                            dataset=arithmetic_dataset(2, seed=0), advantage_estimator="spo_single")
    trainer.train()
    assert spy == [] and trainer.variant_state[STORE] == {}


def test_kl_resume_continues_exactly(tmp_path):
    # the two prompts three times: three steps in one epoch, every step after the first revisits stored prompts
    data = concatenate_datasets([arithmetic_dataset(2, seed=0)] * 3)
    settings = {"dataset": data, "max_steps": 3, "save_strategy": "steps", "save_steps": 1, **KL_FLAGS}
    full = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "full", **settings)
    full.train()
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)
    assert len(saved[STORE]) == 2
    final = full.variant_state[STORE]
    assert any(not torch.equal(saved[STORE][k]["logps"], final[k]["logps"]) for k in final)  # step 3 re-stored

    resumed = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "resumed", **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    state, other = full.variant_state["spo_single"], resumed.variant_state["spo_single"]
    assert torch.equal(other["keys"], state["keys"]) and torch.equal(other["values"], state["values"])
    assert resumed.variant_state[STORE].keys() == final.keys()
    for key, entry in final.items():
        for name, tensor in entry.items():
            assert torch.equal(resumed.variant_state[STORE][key][name], tensor), (key, name)
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_share_the_store_and_d(tmp_path):
    launch(Path(__file__).with_name("spo_single_kl_mp_worker.py"), tmp_path, timeout=600)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.jsonl").read_text())
        assert result["num_stored"] == 3 and result["first_all_new"] and result["second_all_found"], result
        assert result["d_matches_own_rescore"] and result["d_positive"], result
        assert result["ranks_agree_on_store"] and result["ranks_agree_on_state"] and result["ranks_agree_on_d"], result


def test_composes_with_zero_variance_filter(tmp_path, spy):
    """A prompt whose group the sampling stage drops (NaN rewards) is not visited: its response is not stored and
    its tracker entry not created; the other prompt is stored and re-scored at the second step."""

    def reward(prompts, completions, **kwargs):  # constant for the smaller prompt (dropped), parity for the other
        smallest = min(str(p) for p in prompts)
        parity = parity_reward(completions)
        return [1.0 if str(p) == smallest else r for p, r in zip(prompts, parity)]

    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=reward,
                            dataset=arithmetic_dataset(2, seed=0), max_steps=2, rollout_filter="zero_variance_filter",
                            **KL_FLAGS)
    trainer.train()
    first, second = spy
    dropped = {k for k, r in zip(first["keys"].tolist(), first["rewards"].tolist()) if r != r}
    kept = set(first["keys"].tolist()) - dropped
    assert len(dropped) == 1 and len(kept) == 1
    store = trainer.variant_state[STORE]
    assert set(store) == kept and trainer.variant_state["spo_single"]["keys"].tolist() == sorted(kept)
    for key, d in zip(second["keys"].tolist(), second["d"].tolist()):
        assert (d == d) == (key in kept)  # NaN exactly for the prompt never stored
        if key in kept:
            assert d == pytest.approx(second["expected"][key], abs=1e-6)


def test_evaluation_passes_nan_and_leaves_the_store(tmp_path, spy):
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path,
                            dataset=arithmetic_dataset(2, seed=0), **KL_FLAGS)
    trainer.variant_state[STORE][7] = {"marker": torch.ones(1)}
    trainer.model.eval()
    d = trainer._prompt_kl(trainer.variants["advantages"], {}, torch.tensor([7, 7, 8, 8]), torch.zeros(4))
    assert d.shape == (4,) and torch.isnan(d).all() and spy == []
    assert list(trainer.variant_state[STORE]) == [7]
    trainer.model.train()
    constant = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "constant",
                             dataset=arithmetic_dataset(2, seed=0), advantage_estimator="spo_single")
    assert constant._prompt_kl(constant.variants["advantages"], {}, torch.tensor([7]), torch.zeros(1)) is None
