"""VADE (rollout_filter="vade") on the tiny model: the prompts of each generation batch come from the posteriors
updated with every earlier batch's rewards (decided at generation time, although the dataloader fetches ahead);
the gradient changes against plain GRPO (other prompts); full and LoRA; composition with an objective; a resumed
run continues exactly; two processes get the same prompts in the same order (`vade_mp_worker.py`)."""

import json
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.sampling.vade import select_most_informative, thompson_variance_scores
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

G = 4  # conftest: num_generations=4, per_device_train_batch_size=8 → 2 prompts per generation batch


class RecordingReward:
    """parity_reward, recording each call's prompts (one per rollout, global = local on one process) and rewards."""

    __name__ = "parity_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = parity_reward(completions)
        self.calls.append(([p[-1]["content"] for p in prompts], rewards))
        return rewards


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def _selection(alpha, beta, draw, k=2):
    return select_most_informative(thompson_variance_scores(alpha, beta, seed=0, draw=draw), k)


def _prior(n):
    return torch.ones(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)


@pytest.mark.parametrize("peft, accumulation", [(False, 1), (True, 1), (False, 2)])
def test_second_batch_follows_the_first_batch_rewards(tmp_path, peft, accumulation):
    data = arithmetic_dataset(8, seed=0)
    texts = [row["prompt"][-1]["content"] for row in data]
    reward = RecordingReward()
    # gradient_accumulation_steps = steps_per_generation = 1: HF's loop and accelerate's loader fetch batch 2 before
    # batch 1 is generated, the case where a sampler deciding at fetch time could not see batch 1's rewards.
    # With 2, a generation batch (4 prompts) serves two micro-steps and the loader replays its placeholders.
    trainer = ours(tmp_path, peft, rollout_filter="vade", dataset=data, max_steps=2, reward_funcs=[reward],
                   gradient_accumulation_steps=accumulation)
    trainer.train()
    assert len(reward.calls) == 2
    k = 2 * accumulation  # prompts per generation batch: 8 rollouts per micro-step × accumulation / G
    # batch 1: Thompson draw 0 from the prior Beta(1, 1) of all 8 prompts
    first = _selection(*_prior(8), draw=0, k=k)
    assert reward.calls[0][0] == [texts[i] for i in first for _ in range(G)]
    # posteriors after batch 1, by hand: decays leave the prior unchanged; prompt x of batch 1 gets
    # α = 1 + s_x, β = 1 + (4 − s_x) with s_x its successes (parity reward 1 ≥ threshold 1)
    rewards = torch.tensor(reward.calls[0][1]).view(k, G)
    alpha, beta = _prior(8)
    for j, x in enumerate(first):
        s = int(rewards[j].sum())
        alpha[x], beta[x] = 1 + s, 1 + G - s
    second = _selection(alpha, beta, draw=1, k=k)
    assert reward.calls[1][0] == [texts[i] for i in second for _ in range(G)]
    assert second != _selection(*_prior(8), draw=1, k=k)  # the prior alone would have chosen other prompts
    # after batch 2: every posterior decays (0.99 slow, then 0.8 fast for batch 2's prompts) and gains batch 2
    rewards2 = torch.tensor(reward.calls[1][1]).view(k, G)
    alpha, beta = 1 + 0.99 * (alpha - 1), 1 + 0.99 * (beta - 1)
    for j, x in enumerate(second):
        s = int(rewards2[j].sum())
        alpha[x], beta[x] = 1 + 0.8 * (alpha[x] - 1) + s, 1 + 0.8 * (beta[x] - 1) + G - s
    state = trainer.variant_state["vade"]
    torch.testing.assert_close(state["alpha"], alpha)
    torch.testing.assert_close(state["beta"], beta)
    assert state["draws"] == 2 and state["pending"].numel() == 0


def test_gradient_differs_from_plain_grpo_and_composes_with_gmpo(tmp_path):
    data = arithmetic_dataset(8, seed=0)
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", dataset=data))
    _, grads, inputs = one_step(ours(tmp_path / "vade", rollout_filter="vade", dataset=data))
    assert not torch.equal(inputs["prompt_ids"], base_inputs["prompt_ids"])  # other prompts than TRL's sampler
    assert grads_differ(base_grads, grads)
    trainer = ours(tmp_path / "gmpo", rollout_filter="vade", loss_type="gmpo", dataset=data)
    _, gmpo_grads, _ = one_step(trainer)
    assert all(torch.isfinite(g).all() for g in gmpo_grads.values()) and grads_differ(grads, gmpo_grads)
    assert trainer.variant_state["vade"]["draws"] == 1
    assert trainer.variant_state["vade"]["alpha"].sum() + trainer.variant_state["vade"]["beta"].sum() == 16 + 2 * G


def test_resume_continues_exactly(tmp_path):
    data = arithmetic_dataset(8, seed=0)

    def run(path, resume=None):
        reward = RecordingReward()
        trainer = ours(path, rollout_filter="vade", dataset=data, max_steps=3, save_strategy="steps", save_steps=1,
                       reward_funcs=[reward])
        trainer.train(resume_from_checkpoint=resume)
        return trainer, reward

    full, full_reward = run(tmp_path / "full")
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)["vade"]
    assert saved["draws"] == 2 and not torch.equal(saved["alpha"], full.variant_state["vade"]["alpha"])
    resumed, resumed_reward = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed_reward.calls == full_reward.calls[-1:]  # step 3: same prompts, same completions' rewards
    for key in ("alpha", "beta"):
        assert torch.equal(resumed.variant_state["vade"][key], full.variant_state["vade"][key])
    assert resumed.variant_state["vade"]["draws"] == full.variant_state["vade"]["draws"] == 3
    assert_same_weights(full, resumed)


@needs_torchrun
def test_two_processes_get_the_same_prompts_in_the_same_order(tmp_path):
    launch(Path(__file__).with_name("vade_mp_worker.py"), tmp_path, timeout=600)
    results = [json.loads((tmp_path / f"rank{rank}.jsonl").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["ranks_agree_on_selection"] and result["ranks_agree_on_state"], result
        assert result["local_rows_are_my_slice"] and result["matches_replay"], result
    assert results[0]["selections"] == results[1]["selections"] and len(results[0]["selections"]) == 2


def test_the_dataloader_fetches_the_next_batch_before_this_one_is_scored(tmp_path, monkeypatch):
    """Why the selection waits for generation: with TRL's defaults HF's loop and accelerate's loader ask the sampler
    for batch 2 before batch 1 is scored, so a sampler deciding at fetch time would miss batch 1's rewards."""
    from trl_groupx.sampling.prompt_sampler import PromptSelectionSampler

    events, real_iter = [], PromptSelectionSampler.__iter__

    def iterate(self):
        for position, index in enumerate(real_iter(self)):
            if position % (self.prompts_per_batch * self.num_generations) == 0:
                events.append("fetch")
            yield index

    def reward(completions, **kwargs):
        events.append("score")
        return parity_reward(completions)

    reward.__name__ = "parity_reward"
    monkeypatch.setattr(PromptSelectionSampler, "__iter__", iterate)
    trainer = ours(tmp_path, rollout_filter="vade", dataset=arithmetic_dataset(8, seed=0), max_steps=2,
                   reward_funcs=[reward])
    trainer.train()
    assert events[:3] == ["fetch", "fetch", "score"]  # batch 2's indices were drawn before batch 1 was scored
    assert trainer.variant_state["vade"]["draws"] == 2  # yet both selections were made at generation time


def test_trl_still_generates_where_the_seam_expects():
    """`resolve_generation_batch` repeats TRL 1.16's test for "this `_prepare_inputs` call generates"."""
    import inspect

    import trl

    source = inspect.getsource(trl.GRPOTrainer._prepare_inputs)
    assert "generate_every = self.args.steps_per_generation * self.num_iterations" in source
    assert "if self._step % generate_every == 0 or self._buffered_inputs is None:" in source
