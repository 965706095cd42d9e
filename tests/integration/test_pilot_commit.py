"""Pilot-Commit (rollout_filter="pilot_commit") on the tiny model: pilot rollouts of each candidate prompt, scored by a
scripted per-prompt reward, decide which prompts are buffered, excluded or dropped; committed prompts are trained one
pilot round or more after their pilot, with their pilot rollouts (and the pilots' stored rewards) in their group; the
gradient changes against plain GRPO and against pilots that only select (full and LoRA); composition with an
objective; an exact resume from a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_state, assert_same_weights, build_trainer, grads_differ, one_step
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.sampling import pilot_commit as pilot_module
from trl_groupx.sampling import pilot_commit_glue
from trl_groupx.toy import arithmetic_dataset

G = 4  # conftest: num_generations=4, per_device_train_batch_size=8 → B = 2 prompts per generation batch
PILOT = 2  # pilot samples per candidate: a pilot call scores 2·2 = 4 rows, a training call 8
EASY, HARD, MIXED = {0, 1}, {2, 3}, {4, 5, 6, 7}


class ScriptedReward:
    """Per prompt: EASY always 1 (p̂ = 1: excluded), HARD always 0 (p̂ = 0: below the band), MIXED 1 on even rows of
    the call and 0 on odd ones (a pilot's two contiguous rows give p̂ = 0.5, inside [0.125, 0.75]; a training group
    of four gets rewards 1, 0, 1, 0). Records (prompt ids, rewards) of every call."""

    __name__ = "scripted_reward"

    def __init__(self, texts: list[str]):
        self.texts, self.calls = texts, []

    def __call__(self, prompts, completions, **kwargs):
        ids = [self.texts.index(p[-1]["content"]) for p in prompts]
        rewards = [1.0 if i in EASY else 0.0 if i in HARD else float(row % 2 == 0) for row, i in enumerate(ids)]
        self.calls.append((ids, rewards))
        return rewards


class TaggedReward(ScriptedReward):
    """ScriptedReward plus, on MIXED prompts, 0.001 × the completion's length in characters and 0.0001 × the number
    of the call: the same successes and p̂, but a row's reward tells which completion it scored, and when."""

    def __call__(self, prompts, completions, **kwargs):
        rewards = super().__call__(prompts, completions)
        ids = self.calls[-1][0]
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        tag = 1e-4 * len(self.calls)
        rewards = [r + 0.001 * len(t) + tag if i in MIXED else r for r, i, t in zip(rewards, ids, texts)]
        self.calls[-1] = (ids, rewards)
        return rewards


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def scripted(tmp_path, peft=False, reward_class=ScriptedReward, **flags):
    data = arithmetic_dataset(8, seed=0)
    reward = reward_class([row["prompt"][-1]["content"] for row in data])
    flags = dict(rollout_filter="pilot_commit", pilot_commit_pilot_samples=PILOT, **flags)
    return ours(tmp_path, peft, dataset=data, reward_funcs=[reward], **flags), reward


@pytest.fixture
def commits(monkeypatch):
    """Every generation batch's committed prompts with their (pilot round, commit round) pairs."""
    recorded, original = [], pilot_module.commit_rounds

    def recording(state, *args, **kwargs):
        committed, stats = original(state, *args, **kwargs)
        recorded.append((committed, state["committed_rounds"].clone(), stats))
        return committed, stats

    monkeypatch.setattr(pilot_module, "commit_rounds", recording)
    return recorded


@pytest.fixture
def pilots(monkeypatch):
    """Every pilot round's (candidates, per-function rewards (C, n, K), completions [candidate][sample])."""
    recorded, original = [], pilot_commit_glue.pilot_rollouts

    def recording(trainer, indices, samples):
        rewards, per_func, completions = original(trainer, indices, samples)
        recorded.append((list(indices), per_func.clone(), completions))
        return rewards, per_func, completions

    monkeypatch.setattr(pilot_commit_glue, "pilot_rollouts", recording)
    return recorded


def first_committed_batch(trainer):
    """The first training generation batch, unshuffled: the prompt selection (with its pilot rounds), then TRL's
    generation, the pilots' splice and the stages, seeded as `one_step`."""
    trainer.model.train()
    torch.manual_seed(0)
    placeholders = next(iter(trainer.get_train_dataloader()))  # builds the prompt sampler
    rows = trainer._prompt_sampler.generation_rows(placeholders)
    torch.manual_seed(0)
    return trainer._generate_and_score_completions(rows)


def grpo_advantages(rewards):
    """TRL's group-normalised advantages of one group: (r − mean) / (unbiased std + 1e-4)."""
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def test_committed_groups_train_their_pilot_rollouts_with_the_stored_rewards(tmp_path, commits, pilots):
    trainer, reward = scripted(tmp_path, reward_class=TaggedReward)  # PILOT = 2 pilots reused of G = 4
    generated, generate_rows = [], trainer._generate_rows

    def recording(prompt_ids, *args):
        generated.append((len(prompt_ids), trainer._generating_baseline))
        return generate_rows(prompt_ids, *args)

    trainer._generate_rows = recording
    output = first_committed_batch(trainer)
    # the batch's own call generated only the fresh rows: 2 committed groups × (G − PILOT)
    assert [n for n, aside in generated if not aside] == [2 * (G - PILOT)]
    committed = commits[0][0]
    trained = torch.tensor(reward.calls[-1][1])  # the training call: TRL's G fresh rows per committed prompt
    ids, mask = output["completion_ids"], output["completion_mask"]
    expected_rewards, replaced_differ = [], False
    for g, prompt in enumerate(committed):
        candidates, per_func, completions = next(p for p in reversed(pilots) if prompt in p[0])
        c = candidates.index(prompt)
        for slot in range(G):
            row = g * G + slot
            if slot < PILOT:  # the prompt's pilot rollout, with its pilot reward
                n = len(completions[c][slot])
                assert ids[row, :n].tolist() == completions[c][slot] and int(mask[row].sum()) == n
                expected_rewards.append(float(per_func[c, slot, 0]))
                replaced_differ |= abs(float(trained[row]) - expected_rewards[-1]) > 1e-9
            else:  # a fresh rollout, with the reward the training call gave it
                expected_rewards.append(float(trained[row]))
    assert replaced_differ  # the training call scored the pilots again, otherwise: the stored rewards are used
    expected = torch.tensor(expected_rewards, dtype=torch.float32)
    assert torch.allclose(trainer._rewards_per_func[:, 0].cpu(), expected)
    want = torch.cat([grpo_advantages(expected[g * G:(g + 1) * G]) for g in range(len(committed))])
    assert torch.allclose(output["advantages"].cpu(), want, atol=1e-5)
    assert trainer._metrics["train"]["groupx/pilot_commit_reused_rows"][-1] == len(committed) * PILOT
    assert "commit_pilots" not in trainer.variant_state["pilot_commit"]  # consumed: never saved with a checkpoint


def test_reused_pilots_zero_trains_the_fresh_rollouts_only(tmp_path, commits, pilots):
    trainer, reward = scripted(tmp_path, reward_class=TaggedReward, pilot_commit_reused_pilots=0)
    output = first_committed_batch(trainer)
    trained = torch.tensor(reward.calls[-1][1], dtype=torch.float32)
    assert torch.allclose(trainer._rewards_per_func[:, 0].cpu(), trained)
    want = torch.cat([grpo_advantages(trained[g * G:(g + 1) * G]) for g in range(len(commits[0][0]))])
    assert torch.allclose(output["advantages"].cpu(), want, atol=1e-5)
    assert trainer._metrics["train"]["groupx/pilot_commit_reused_rows"][-1] == 0
    assert "pilot_rollouts" not in trainer.variant_state["pilot_commit"]


@pytest.mark.parametrize("peft", [False, True])
def test_reusing_the_pilots_changes_the_update(tmp_path, peft):
    _, only_select, _ = one_step(scripted(tmp_path / "select", peft, TaggedReward, pilot_commit_reused_pilots=0)[0])
    _, reused, _ = one_step(scripted(tmp_path / "reuse", peft, TaggedReward)[0])
    assert grads_differ(only_select, reused)


def test_only_band_prompts_are_trained_one_round_after_their_pilot(tmp_path, commits):
    trainer, reward = scripted(tmp_path, max_steps=3)
    trainer.train()
    state = trainer.variant_state["pilot_commit"]
    training = [ids for ids, _ in reward.calls if len(ids) == 2 * G]
    pilots = [ids for ids, _ in reward.calls if len(ids) == 2 * PILOT]
    assert len(training) == 3 and pilots and state["pass"] >= 1  # the candidate stream went round the dataset
    for ids in training:
        assert set(ids) <= MIXED and len(set(ids)) == 2  # two committed prompts, G rows each
    piloted = {i for ids in pilots for i in ids}
    assert EASY <= piloted and HARD & piloted  # the run met every kind of prompt
    for easy in EASY:  # excluded after its first pilot: never piloted again, even in the next pass
        assert sum(easy in ids for ids in pilots) == 1
    assert piloted & EASY <= set(state["excluded"].tolist()) and set(state["excluded"].tolist()) <= EASY
    assert len(commits) == 3
    for (committed, rounds, _), ids in zip(commits, training):
        assert ids == [i for i in committed for _ in range(G)]  # TRL trained exactly the committed prompts
        assert rounds.shape == (2, 2) and (rounds[:, 0] < rounds[:, 1]).all()  # ≥ 1 pilot round later


@pytest.mark.parametrize("peft", [False, True])
def test_gradient_differs_from_plain_grpo(tmp_path, peft):
    data = arithmetic_dataset(8, seed=0)
    reward = ScriptedReward([row["prompt"][-1]["content"] for row in data])
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, dataset=data, reward_funcs=[reward]))
    trainer, _ = scripted(tmp_path / "pc", peft)
    _, grads, inputs = one_step(trainer)
    assert not torch.equal(inputs["prompt_ids"], base_inputs["prompt_ids"])  # committed band prompts, not TRL's
    assert grads_differ(base_grads, grads)


def test_composes_with_gmpo(tmp_path, commits):
    trainer, reward = scripted(tmp_path, loss_type="gmpo", pilot_commit_selection="max_variance")
    _, grads, _ = one_step(trainer)
    assert all(torch.isfinite(g).all() for g in grads.values()) and any(g.abs().sum() > 0 for g in grads.values())
    assert set(commits[0][0]) <= MIXED


def test_a_batch_short_after_max_rounds_is_filled_nearest_the_band(tmp_path, commits):
    # band [0.9, 0.95], nothing excluded: no pilot is in the band; after 3 rounds (6 candidates) the batch takes the
    # two piloted prompts nearest to it: EASY (p̂ = 1, distance .05) before MIXED (.4) before HARD (.9)
    trainer, reward = scripted(tmp_path, pilot_commit_band_low=0.9, pilot_commit_band_high=0.95,
                               pilot_commit_exclude_threshold=None, pilot_commit_max_rounds=3)
    loss, _, _ = one_step(trainer)
    assert torch.isfinite(loss)
    committed, rounds, stats = commits[0]
    piloted = [i for ids, _ in reward.calls if len(ids) == 2 * PILOT for i in ids[::PILOT]]
    distance = {i: 0.05 if i in EASY else 0.4 if i in MIXED else 0.9 for i in piloted}
    assert len(piloted) == 6 and stats["rounds"] == 3 and stats["filled"] == 2
    assert committed == sorted(piloted, key=lambda i: (distance[i], piloted.index(i)))[:2]
    assert (rounds[:, 0] < rounds[:, 1]).all()


def test_a_batch_that_cannot_be_filled_is_a_clear_error(tmp_path):
    trainer, _ = scripted(tmp_path, pilot_commit_band_low=0.9, pilot_commit_band_high=0.95,
                          pilot_commit_exclude_threshold=None, pilot_commit_max_rounds=1, pilot_commit_pilot_prompts=1)
    with pytest.raises(RuntimeError, match="pilot_commit_max_rounds=1.*met 1 distinct prompts for 2 slots"):
        one_step(trainer)


@pytest.mark.parametrize("flags, match", [
    (dict(pilot_commit_pilot_samples=0), "pilot_commit_pilot_samples=0"),
    (dict(pilot_commit_band_low=0.8, pilot_commit_band_high=0.5), "band is empty"),
    (dict(pilot_commit_band_high=1.5), r"pilot_commit_band_high=1.5: use an accuracy in \[0, 1\]"),
    (dict(pilot_commit_exclude_threshold=0.5), "pilot_commit_exclude_threshold=0.5 ≤ pilot_commit_band_high"),
    (dict(pilot_commit_selection="best"), "pilot_commit_selection='best'"),
    (dict(pilot_commit_off_steps=-1), "pilot_commit_off_steps=-1"),
    (dict(pilot_commit_success_threshold=float("nan")), "pilot_commit_success_threshold=nan"),
    (dict(pilot_commit_reused_pilots=-1), "pilot_commit_reused_pilots=-1"),
    (dict(pilot_commit_pilot_samples=2, pilot_commit_reused_pilots=3),
     "pilot_commit_reused_pilots=3 > pilot_commit_pilot_samples=2"),
    (dict(pilot_commit_pilot_samples=8), r"pilot_commit_reused_pilots=8 \(None = every one of the 8 pilot rollouts\) ≥ "
     "num_generations=8: a committed group needs at least one fresh rollout"),
])
def test_bad_flags_fail_at_config_construction(tmp_path, flags, match):
    with pytest.raises(ValueError, match=match):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, rollout_filter="pilot_commit", **flags)


def test_resume_continues_the_selection_exactly(tmp_path, commits):
    full, _ = scripted(tmp_path / "full", max_steps=4, save_strategy="steps", save_steps=3)
    full.train()
    uninterrupted = [c for c, _, _ in commits]
    commits.clear()
    resumed, _ = scripted(tmp_path / "resumed", max_steps=4, save_strategy="steps", save_steps=3)
    saved = torch.load(tmp_path / "full" / "checkpoint-3" / "trl_groupx_variant_state.pt", weights_only=True)
    assert saved["pilot_commit"]["pilot_rollouts"]  # the buffered prompts' pilot rollouts travel with the checkpoint
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert [c for c, _, _ in commits] == uninterrupted[3:]
    assert_same_state(full.variant_state["pilot_commit"], resumed.variant_state["pilot_commit"])
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_commit_the_same_prompts(tmp_path):
    launch(Path(__file__).with_name("pilot_commit_mp_worker.py"), tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree"] and result["trained_my_slice"], result
        assert result["piloted_my_slice"] and result["band_only"] and result["trained_my_pilots"], result
    assert results[0]["commits"] == results[1]["commits"]
