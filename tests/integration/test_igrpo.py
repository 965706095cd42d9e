"""iGRPO on the tiny model: stage 1 samples k drafts per prompt and scores them with the run's reward function;
stage 2's prompt is the original prompt plus the template filled with the argmax-reward draft; the batch the loss
sees holds the stage-2 prompts and their refinements only (never the drafts), with log-probs under the stage-2
prompt; the update differs from plain GRPO; composes with RLOO; bad setups fail at construction."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.advantages import rloo_advantages
from trl_groupx.sampling.igrpo import IGRPO_DRAFT_TEMPLATE

SHORT_TEMPLATE = " Draft: {draft}"  # keeps the toy model's stage-2 prompts within its 64 positions


class RecordingReward:
    """parity_reward that remembers each call's prompts, completions, completion ids, rewards and draft column."""

    __name__ = "parity_reward"

    def __init__(self, none_on_first_call: bool = False):
        self.calls = []
        self.none_on_first_call = none_on_first_call

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        rewards = parity_reward(completions)
        if self.none_on_first_call and not self.calls:
            rewards = [None] * len(rewards)
        self.calls.append(dict(prompts=prompts, texts=[c[-1]["content"] for c in completions],
                               ids=[list(c) for c in completion_ids], rewards=rewards,
                               drafts=kwargs.get("igrpo_draft")))
        return rewards


def ours(tmp_path, peft=False, reward=None, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=reward or parity_reward, **flags)


def _user(prompt):
    return prompt[-1]["content"]


def _expected_best(rewards):
    """Hand argmax over one prompt's draft rewards: the largest, the lowest index among equals."""
    return max(range(len(rewards)), key=lambda j: (rewards[j], -j))


def _rows(trainer, inputs):
    """Multiset of (prompt ids, completion ids, advantage) of the rows the loss sees (rows are shuffled)."""
    rows = []
    for p, pm, c, cm, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                               inputs["completion_mask"], inputs["advantages"].tolist()):
        rows.append((tuple(p[pm.bool()].tolist()), tuple(c[cm.bool()].tolist()), round(a, 5)))
    return Counter(rows)


def _template_ids(trainer, prompt):
    ids = trainer.processing_class.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)
    return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _check_stage_two(trainer, reward, inputs, k, template, group_size=4):
    """The two reward calls are (drafts, refinements); stage-2 prompts = prompt + template(argmax draft); the loss
    batch is exactly the refinements under their stage-2 prompts. Returns the refinement call."""
    drafts, stage2 = reward.calls
    n = len(stage2["prompts"])
    assert len(drafts["prompts"]) == (n // group_size) * k  # k drafts per prompt
    for g in range(n // group_size):
        group_prompts = drafts["prompts"][g * k:(g + 1) * k]
        assert all(_user(p) == _user(group_prompts[0]) for p in group_prompts)  # k drafts of one prompt
        best = _expected_best(drafts["rewards"][g * k:(g + 1) * k])
        draft = drafts["texts"][g * k + best]
        for i in range(g * group_size, (g + 1) * group_size):
            assert stage2["drafts"][i] == draft
            assert _user(stage2["prompts"][i]) == _user(group_prompts[0]) + template.replace("{draft}", draft)
    # the loss sees the stage-2 prompt tokens and the refinements, nothing else
    rows = _rows(trainer, inputs)
    assert Counter(p for (p, _, _), m in rows.items() for _ in range(m)) == Counter(
        _template_ids(trainer, p) for p in stage2["prompts"])
    assert Counter(c for (_, c, _), m in rows.items() for _ in range(m)) == Counter(
        tuple(ids) for ids in stage2["ids"])
    return stage2


@pytest.mark.parametrize("peft", [False, True])
def test_igrpo_trains_refinements_of_the_argmax_draft(tmp_path, peft):
    _, base_grads, _ = one_step(ours(tmp_path / "base", peft))
    reward = RecordingReward()
    trainer = ours(tmp_path / "igrpo", peft, reward=reward, rollout_filter="igrpo", igrpo_num_drafts=3,
                   igrpo_draft_template=SHORT_TEMPLATE)
    _, grads, inputs = one_step(trainer)
    stage2 = _check_stage_two(trainer, reward, inputs, 3, SHORT_TEMPLATE)
    # advantages: TRL's GRPO on the refinements' rewards, (r - mean_g) / (std_g + 1e-4)
    r = torch.tensor(stage2["rewards"]).view(-1, 4)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    want = Counter((_template_ids(trainer, p), tuple(c), round(a, 5))
                   for p, c, a in zip(stage2["prompts"], stage2["ids"], expected.tolist()))
    assert _rows(trainer, inputs) == want
    assert grads_differ(base_grads, grads)
    assert trainer._metrics["train"]["groupx/igrpo_prompts_without_draft"] == [0.0]


def test_default_template_and_draft_count(tmp_path):
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, rollout_filter="igrpo")
    _, _, inputs = one_step(trainer)
    _check_stage_two(trainer, reward, inputs, 4, IGRPO_DRAFT_TEMPLATE)  # None -> k = num_generations = 4


def test_log_probs_are_computed_under_the_stage_two_prompt(tmp_path):
    """With num_iterations=2 TRL keeps the rollouts' old log-probs: they must be log π(y | prompt ⊕ draft)."""
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, rollout_filter="igrpo", igrpo_num_drafts=2,
                   igrpo_draft_template=SHORT_TEMPLATE, num_iterations=2)
    _, _, inputs = one_step(trainer)
    stage2 = reward.calls[1]
    model = trainer.accelerator.unwrap_model(trainer.model)
    checked = 0
    for row in range(inputs["completion_ids"].size(0)):
        completion = inputs["completion_ids"][row][inputs["completion_mask"][row].bool()].tolist()
        prompt_ids = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
        i = next(i for i, (p, c) in enumerate(zip(stage2["prompts"], stage2["ids"]))
                 if c == completion and _template_ids(trainer, p) == tuple(prompt_ids))
        suffix = SHORT_TEMPLATE.replace("{draft}", stage2["drafts"][i])
        original = [{"role": "user", "content": _user(stage2["prompts"][i])[: -len(suffix)]}]
        logps = {}
        for name, context in (("stage2", list(_template_ids(trainer, stage2["prompts"][i]))),
                              ("original", list(_template_ids(trainer, original)))):
            full = torch.tensor([context + completion])
            with torch.no_grad():
                logits = model(full).logits[0, len(context) - 1:-1] / trainer.temperature
            logps[name] = logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
        old = inputs["old_per_token_logps"][row][: len(completion)]
        assert torch.allclose(old, logps["stage2"], atol=1e-5)
        assert not torch.allclose(old, logps["original"], atol=1e-3)
        checked += 1
    assert checked == 8


def test_composes_with_rloo(tmp_path):
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, rollout_filter="igrpo", igrpo_num_drafts=2,
                   igrpo_draft_template=SHORT_TEMPLATE, advantage_estimator="rloo")
    _, grads, inputs = one_step(trainer)
    stage2 = _check_stage_two(trainer, reward, inputs, 2, SHORT_TEMPLATE)
    expected = rloo_advantages(torch.tensor(stage2["rewards"]), 4)
    want = Counter((_template_ids(trainer, p), tuple(c), round(a, 5))
                   for p, c, a in zip(stage2["prompts"], stage2["ids"], expected.tolist()))
    assert _rows(trainer, inputs) == want
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_group_size_two_with_one_draft(tmp_path):
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, rollout_filter="igrpo", igrpo_num_drafts=1,
                   igrpo_draft_template=SHORT_TEMPLATE, num_generations=2, per_device_train_batch_size=4)
    _, _, inputs = one_step(trainer)
    _check_stage_two(trainer, reward, inputs, 1, SHORT_TEMPLATE, group_size=2)


def test_unscored_drafts_leave_the_prompt_unchanged(tmp_path):
    reward = RecordingReward(none_on_first_call=True)  # every draft unscored (NaN)
    trainer = ours(tmp_path, reward=reward, rollout_filter="igrpo", igrpo_num_drafts=2,
                   igrpo_draft_template=SHORT_TEMPLATE)
    one_step(trainer)
    drafts, stage2 = reward.calls
    assert stage2["drafts"] == [None] * 8
    assert [_user(p) for p in stage2["prompts"][::4]] == [_user(p) for p in drafts["prompts"][::2]]
    assert all("Draft:" not in _user(p) for p in stage2["prompts"])
    assert trainer._metrics["train"]["groupx/igrpo_prompts_without_draft"] == [1.0]


def test_evaluation_samples_without_drafts(tmp_path):
    reward = RecordingReward()
    trainer = ours(tmp_path, reward=reward, rollout_filter="igrpo", igrpo_num_drafts=2)
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)
    assert len(reward.calls) == 1 and reward.calls[0]["drafts"] is None


def test_a_rollout_func_fails_at_construction(tmp_path):
    def rollout_func(prompts, trainer):  # never called
        raise AssertionError

    with pytest.raises(ValueError, match="rollout_filter='igrpo'.*rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, rollout_filter="igrpo",
                      rollout_func=rollout_func)


@needs_torchrun
def test_two_processes_share_the_split_groups_best_draft(tmp_path):
    launch(Path(__file__).with_name("igrpo_mp_worker.py"), tmp_path)
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["one_stage_two_prompt_per_group"] and r["argmax_of_the_owners_drafts"], r
        assert r["drafts_per_rank"] == r["expected_drafts_per_rank"], r
        assert r["matches_grpo"], r
