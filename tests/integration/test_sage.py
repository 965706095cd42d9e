"""SAGE on the tiny model, with the toy dataset's `answer` column as the privileged reference: groups that no rollout
solves ask the policy (greedy) for hints written from the reference, and are generated again from prompt ⊕ hint,
level by level; the loss sees the re-rolled groups under their hinted prompts (hint tokens only in the prompt);
reward functions always see the prompt without the hint; evaluation is never hinted; the update differs from plain
GRPO; composes with RLOO; bad setups fail at construction.

The tiny model cannot write JSON, so most tests replace the hint parser by one that turns the policy's greedy reply
into three tagged levels (`TaggedLevels`): the reply still comes from the policy, through the trainer.
"""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from datasets import Dataset

import trl_groupx
import trl_groupx.sampling.self_hints as self_hints
from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.advantages import rloo_advantages
from trl_groupx.sampling.sage import SAGE_HINT_INSTRUCTION, SAGE_HINT_TEMPLATE
from trl_groupx.toy import arithmetic_dataset

# short texts keep the hint requests and the hinted prompts within the toy model's 64 positions
SHORT = dict(sage_column="answer", sage_hint_instruction="H", sage_hint_request_template="{question}|{solution}",
             sage_hint_template=" Hint:{hint}")


class ScriptedReward:
    """Rewards per call: `zero_calls` first calls score 0 everywhere (no group solved), later calls parity_reward
    (or, `alternate=True`, 1 on even rows and 0 on odd ones, so that every group is solved). Records each call's
    prompts, completion texts and ids, rewards and column names."""

    __name__ = "parity_reward"

    def __init__(self, zero_calls: int = 1, constant: float | None = None, alternate: bool = False):
        self.zero_calls, self.constant, self.alternate, self.calls = zero_calls, constant, alternate, []

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        if self.constant is not None:
            rewards = [self.constant] * len(prompts)
        elif len(self.calls) < self.zero_calls:
            rewards = [0.0] * len(prompts)
        elif self.alternate:
            rewards = [float(i % 2 == 0) for i in range(len(prompts))]
        else:
            rewards = parity_reward(completions)
        self.calls.append(dict(prompts=prompts, texts=[c[-1]["content"] if isinstance(c, list) else c
                                                      for c in completions],
                               ids=[list(c) for c in completion_ids], rewards=rewards, columns=sorted(kwargs)))
        return rewards


class TaggedLevels:
    """Parser stand-in: every reply becomes levels `"1<reply[:2]>"`, `"2"`, `"3"`; remembers the replies."""

    def __init__(self):
        self.replies = []

    def __call__(self, text):
        self.replies.append(text)
        return {"level_1": "1" + text[:2], "level_2": "2", "level_3": "3"}


@pytest.fixture
def tagged(monkeypatch):
    parser = TaggedLevels()
    monkeypatch.setattr(self_hints, "parse_hint_levels", parser)
    return parser


def ours(tmp_path, peft=False, reward=None, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=reward or parity_reward, **flags)


def _user(prompt):
    return prompt[-1]["content"]


def _template_ids(trainer, prompt):
    ids = trainer.processing_class.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)
    return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _rows(inputs):
    """Multiset of (prompt ids, completion ids, advantage) of the rows the loss sees (rows are shuffled)."""
    return Counter((tuple(p[pm.bool()].tolist()), tuple(c[cm.bool()].tolist()), round(a, 5))
                   for p, pm, c, cm, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                                              inputs["completion_mask"], inputs["advantages"].tolist()))


def _grpo(rewards, group_size=4):
    r = torch.tensor(rewards).view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)


@pytest.mark.parametrize("peft", [False, True])
def test_unsolved_groups_train_on_hinted_rerolls(tmp_path, tagged, peft):
    _, base_grads, _ = one_step(ours(tmp_path / "base", peft))
    # the first rollout solves nothing, so every group asks for a hint; the level-1 re-roll solves every group
    reward = ScriptedReward(zero_calls=1, alternate=True)
    trainer = ours(tmp_path / "sage", peft, reward=reward, rollout_filter="sage", **SHORT)
    _, grads, inputs = one_step(trainer)
    first, reroll = reward.calls  # no level 2: nothing left unsolved
    assert len(tagged.replies) == 2  # one hint per prompt (2 prompts × G = 4)
    # rewards see the original prompts (no hint) in both calls; the re-roll rows carry sage_prompt
    assert [_user(p) for p in reroll["prompts"]] == [_user(p) for p in first["prompts"]]
    assert all("Hint:" not in _user(p) for call in reward.calls for p in call["prompts"])
    assert "sage_prompt" in reroll["columns"] and "answer" in reroll["columns"]
    # the loss sees exactly the re-rolled completions under prompt ⊕ level-1 hint; GRPO advantages on their rewards
    hinted = [[{"role": "user", "content": _user(p) + " Hint:1" + tagged.replies[i // 4][:2]}]
              for i, p in enumerate(reroll["prompts"])]
    want = Counter((_template_ids(trainer, p), tuple(c), round(a, 5))
                   for p, c, a in zip(hinted, reroll["ids"], _grpo(reroll["rewards"]).tolist()))
    assert _rows(inputs) == want
    # hint tokens are prompt tokens only: the loss mask covers exactly the sampled completion tokens
    assert int(inputs["completion_mask"].sum()) == sum(len(ids) for ids in reroll["ids"])
    assert grads_differ(base_grads, grads)
    metrics = trainer._metrics["train"]
    assert metrics["groupx/sage_unsolved_groups"] == [1.0] and metrics["groupx/sage_hinted_level_1"] == [1.0]


def test_hint_is_the_policys_greedy_reply_to_the_privileged_request(tmp_path, tagged, monkeypatch):
    requests = []
    build = self_hints.hint_request
    monkeypatch.setattr(self_hints, "hint_request", lambda *a: requests.append(build(*a)) or requests[-1])
    trainer = ours(tmp_path, reward=ScriptedReward(zero_calls=1), rollout_filter="sage", **SHORT)
    batch = next(iter(trainer.get_train_dataloader()))
    one_step(trainer)
    firsts = batch[::4]
    assert requests == [[{"role": "system", "content": "H"},
                         {"role": "user", "content": f"{_user(x['prompt'])}|{x['answer']}"}] for x in firsts]
    model = trainer.accelerator.unwrap_model(trainer.model)
    for request, reply in zip(requests, tagged.replies):
        ids = torch.tensor([list(_template_ids(trainer, request))])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                                 pad_token_id=trainer.processing_class.pad_token_id)
        assert trainer.processing_class.decode(out[0, ids.size(1):], skip_special_tokens=True) == reply


def test_default_texts(tmp_path, tagged, monkeypatch):
    """The shipped instruction, request layout and hint template (the toy model reads past its 64 positions with
    RoPE, so the long request still runs)."""
    requests = []
    build = self_hints.hint_request
    monkeypatch.setattr(self_hints, "hint_request", lambda *a: requests.append(build(*a)) or requests[-1])
    reward = ScriptedReward(zero_calls=1, alternate=True)
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", sage_column="answer")
    batch = next(iter(trainer.get_train_dataloader()))
    _, _, inputs = one_step(trainer)
    assert requests[0] == [{"role": "system", "content": SAGE_HINT_INSTRUCTION},
                           {"role": "user", "content": f"Question:\n{_user(batch[0]['prompt'])}\n\nSolution:\n"
                                                       f"{batch[0]['answer']}\n"}]
    hint = "1" + tagged.replies[0][:2]
    prompt = [{"role": "user", "content": _user(batch[0]["prompt"]) + SAGE_HINT_TEMPLATE.replace("{hint}", hint)}]
    assert sum(tuple(p[m.bool()].tolist()) == _template_ids(trainer, prompt)
               for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])) == 4


def test_levels_escalate_while_a_group_stays_unsolved(tmp_path, tagged):
    reward = ScriptedReward(zero_calls=2)  # the first rollout and the level-1 re-roll solve nothing
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", **SHORT)
    _, _, inputs = one_step(trainer)
    calls = reward.calls
    level2 = calls[2]
    solved2 = [any(r > 0 for r in level2["rewards"][g * 4:(g + 1) * 4]) for g in range(2)]
    assert len(calls) == 3 + (not all(solved2))  # level 3 runs only for a group level 2 left unsolved
    final = calls[3]["rewards"] if len(calls) == 4 else None
    expected_rows = Counter()
    rewards = []
    for g in range(2):
        call, tag = (level2, "2") if solved2[g] else (calls[3], "3")
        for i in range(g * 4, (g + 1) * 4):
            prompt = [{"role": "user", "content": _user(call["prompts"][i]) + " Hint:" + tag}]
            expected_rows[(_template_ids(trainer, prompt), tuple(call["ids"][i]))] += 1
            rewards.append(call["rewards"][i])
    assert Counter((p, c) for (p, c, _), m in _rows(inputs).items() for _ in range(m)) == expected_rows
    metrics = trainer._metrics["train"]
    assert metrics["groupx/sage_hinted_level_1"] == [0.0]
    assert metrics["groupx/sage_hinted_level_2"] == [sum(solved2) / 2 if final is not None else 1.0]
    assert trainer._rewards_per_func[:, 0].tolist() == rewards


def test_solved_groups_are_neither_hinted_nor_rerolled(tmp_path, tagged):
    reward = ScriptedReward(constant=1.0)
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", **SHORT)
    _, _, inputs = one_step(trainer)
    assert len(reward.calls) == 1 and tagged.replies == []
    assert all("Hint:" not in trainer.processing_class.decode(p) for p in inputs["prompt_ids"])
    assert trainer._metrics["train"]["groupx/sage_unsolved_groups"] == [0.0]


def test_unparsable_hints_leave_the_group_unhinted(tmp_path):
    """The real parser on the tiny model's replies (no JSON): no hint, no re-roll, counted."""
    reward = ScriptedReward(zero_calls=1)
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", **SHORT)
    one_step(trainer)
    assert len(reward.calls) == 1
    assert trainer._metrics["train"]["groupx/sage_hint_failed"] == [2.0]


def test_missing_or_blank_references_are_not_hinted(tmp_path, tagged):
    """None, empty and blank references (an Arrow string column holds no NaN; NaN is unit-tested)."""
    rows = list(arithmetic_dataset(64, seed=0))
    for i, row in enumerate(rows):
        row["answer"] = [None, "", "  ", row["answer"]][i % 4]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    reward = ScriptedReward(zero_calls=1)
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=reward,
                            dataset=dataset, rollout_filter="sage", per_device_train_batch_size=16, **SHORT)
    batch = next(iter(trainer.get_train_dataloader()))
    one_step(trainer)
    has_reference = [isinstance(x["answer"], str) and x["answer"].strip() != "" for x in batch[::4]]
    assert len(tagged.replies) == sum(has_reference)
    assert trainer._metrics["train"]["groupx/sage_no_reference"] == [float(4 - sum(has_reference))]
    hinted = [("Hint:" in _user(p)) for p in reward.calls[-1]["prompts"]] if len(reward.calls) > 1 else []
    assert not any(hinted)  # reward functions never see the hint
    assert math.isclose(trainer._metrics["train"]["groupx/sage_hinted_level_1"][0], sum(has_reference) / 4)


def test_text_prompts(tmp_path, tagged):
    """A dataset of plain-text prompts: the request is one text, the hint is appended to the prompt string."""
    dataset = Dataset.from_list([{"prompt": _user(r["prompt"]), "answer": r["answer"]}
                                 for r in arithmetic_dataset(64, seed=0)])
    reward = ScriptedReward(zero_calls=1, alternate=True)
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=reward,
                            dataset=dataset, rollout_filter="sage", **SHORT)
    batch = next(iter(trainer.get_train_dataloader()))
    _, _, inputs = one_step(trainer)
    first, reroll = reward.calls
    assert reroll["prompts"] == first["prompts"] == [x["prompt"] for x in batch]  # rewards see x
    tokenizer = trainer.processing_class
    want = Counter(tuple(tokenizer(p + " Hint:1" + tagged.replies[i // 4][:2], add_special_tokens=False)["input_ids"])
                   for i, p in enumerate(reroll["prompts"]))
    assert Counter(tuple(p[m.bool()].tolist()) for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])) == want


def test_group_size_two(tmp_path, tagged):
    reward = ScriptedReward(zero_calls=1, alternate=True)
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", num_generations=2, per_device_train_batch_size=4,
                   **SHORT)
    _, _, inputs = one_step(trainer)
    assert len(tagged.replies) == 2 and len(reward.calls) == 2
    reroll = reward.calls[1]
    # G = 2, rewards (1, 0) per group: mean 1/2, std 1/sqrt(2) -> advantages ±(1/2) / (0.70711 + 1e-4) = ±0.70700
    advantages = _grpo(reroll["rewards"], 2)
    assert torch.allclose(advantages.abs(), torch.full((4,), 0.5 / (2 ** -0.5 + 1e-4)))
    hinted = [[{"role": "user", "content": _user(p) + " Hint:1" + tagged.replies[i // 2][:2]}]
              for i, p in enumerate(reroll["prompts"])]
    assert _rows(inputs) == Counter((_template_ids(trainer, p), tuple(c), round(a, 5))
                                    for p, c, a in zip(hinted, reroll["ids"], advantages.tolist()))


def test_composes_with_rloo(tmp_path, tagged):
    reward = ScriptedReward(zero_calls=1)
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", advantage_estimator="rloo", **SHORT)
    _, grads, inputs = one_step(trainer)
    expected = rloo_advantages(trainer._rewards_per_func[:, 0], 4)
    got = sorted(round(a, 5) for a in inputs["advantages"].tolist())
    assert got == sorted(round(a, 5) for a in expected.tolist())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_evaluation_is_never_hinted(tmp_path, tagged):
    reward = ScriptedReward(zero_calls=10)
    trainer = ours(tmp_path, reward=reward, rollout_filter="sage", **SHORT)
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)
    assert len(reward.calls) == 1 and tagged.replies == []
    assert "sage_prompt" not in reward.calls[0]["columns"]


def test_missing_reference_column_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="sage_column='solution'.*lacks.*set sage_column"):
        ours(tmp_path, rollout_filter="sage")


def test_a_rollout_func_fails_at_construction(tmp_path):
    def rollout_func(prompts, trainer):  # never called
        raise AssertionError

    with pytest.raises(ValueError, match="rollout_filter='sage'.*rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, rollout_filter="sage",
                      rollout_func=rollout_func, sage_column="answer")


def test_bad_flags_fail_at_config(tmp_path):
    with pytest.raises(ValueError, match="use_vllm"):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, rollout_filter="sage", use_vllm=True)
    with pytest.raises(ValueError, match="sage_hint_template"):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, rollout_filter="sage",
                              sage_hint_template="no field")
    with pytest.raises(ValueError, match="advantage_estimator='spo_single'.*prompt"):
        trl_groupx.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, rollout_filter="sage",
                              advantage_estimator="spo_single")


@needs_torchrun
def test_two_processes_share_one_hint_per_group(tmp_path):
    launch(Path(__file__).with_name("sage_mp_worker.py"), tmp_path)
    results = [json.loads(line) for rank in (0, 1)
               for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["one_hinted_prompt_per_group"] and r["same_hints_on_both_ranks"], r
        assert r["matches_grpo"] and r["rewards_see_x"], r
