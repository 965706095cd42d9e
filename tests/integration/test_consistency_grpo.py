"""consistency_grpo on the tiny model with a tiny paraphrase dataset (the toy arithmetic problems, each with four
phrasings: "2+3=", "3+2=", "What is 2+3?", "2 + 3 ="): each training group's prompts are its row's variants in
order, the advantages are normalised over the paraphrase group (hand-derived with a phrasing-dependent reward), the
update differs from plain GRPO (full and LoRA), fewer variants cycle, text prompts work, evaluation is not
rewritten, RLOO and stability_reward compose with it, bad datasets are refused at construction, and two processes
holding halves of a group agree with one."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from tests.conftest import build_trainer, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx import GRPOConfig, GRPOTrainer
from trl_groupx.advantages import rloo_advantages
from trl_groupx.rewards import stability_reward
from trl_groupx.rewards._utils import answer_text, normalize_text
from trl_groupx.toy import arithmetic_dataset, load_tiny_tokenizer
from trl_groupx.toy.paraphrases import add_arithmetic_paraphrases

FLAGS = dict(rollout_filter="consistency_grpo")


class RecordingReward:
    """A reward that remembers each call's prompts, completions, rewards and the columns the rewrite sets."""

    def __init__(self, inner=parity_reward, name="parity_reward"):
        self.calls, self.inner, self.__name__ = [], inner, name

    def __call__(self, prompts, completions, **kwargs):
        rewards = self.inner(prompts=prompts, completions=completions, **kwargs)
        self.calls.append(dict(prompts=prompts, completions=completions, rewards=rewards,
                               paraphrases=kwargs.get("paraphrases"), ids=kwargs.get("paraphrase_id"),
                               variants=kwargs.get("consistency_grpo_variant")))
        return rewards


def paraphrase_dataset(n=64, text=False):
    """The toy problems with their phrasings (`text`: plain-string prompts and variants)."""
    data = add_arithmetic_paraphrases(arithmetic_dataset(n, seed=0))
    if text:
        data = data.map(lambda r: {"prompt": r["prompt"][-1]["content"],
                                   "paraphrases": [v[-1]["content"] for v in r["paraphrases"]]})
    return data


def trainer_for(tmp_path, peft=False, reward=None, dataset=None, **flags):
    return build_trainer(GRPOTrainer, GRPOConfig, tmp_path, peft=peft, reward_funcs=reward or parity_reward,
                         dataset=dataset if dataset is not None else paraphrase_dataset(), **flags)


def _rendered(tokenizer, prompt):
    return prompt if isinstance(prompt, str) else tokenizer.apply_chat_template(prompt, add_generation_prompt=True,
                                                                               tokenize=False)


def _rows_with_advantages(trainer, inputs):
    """Counter of (decoded prompt, rounded advantage) over the rows the loss sees (TRL shuffles them)."""
    tok = trainer.processing_class
    return Counter((tok.decode(p[m.bool()]), round(a, 4))
                   for p, m, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["advantages"].tolist()))


def _check_groups(call, group_size=4):
    """Every group: one dataset row's variants (the `paraphrases` column) in order, cycled, with the group's id."""
    for r, prompt in enumerate(call["prompts"]):
        variants = call["paraphrases"][r]
        assert call["paraphrases"][r - r % group_size] == variants  # the whole group comes from one row
        assert prompt == variants[(r % group_size) % len(variants)]
        assert call["ids"][r] == r // group_size and call["variants"][r] == (r % group_size) % len(variants)


@pytest.mark.parametrize("peft", [False, True])
def test_groups_are_the_paraphrases_and_the_update_differs(tmp_path, peft):
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", peft))
    reward = RecordingReward()
    trainer = trainer_for(tmp_path / "cg", peft, reward=reward, **FLAGS)
    _, grads, inputs = one_step(trainer)
    (call,) = reward.calls
    _check_groups(call)
    for g in range(2):  # the four phrasings of the group's problem a+b, in the column's order
        a, b = call["prompts"][4 * g][0]["content"][:-1].split("+")
        assert [v[0]["content"] for v in call["prompts"][4 * g:4 * g + 4]] == [
            f"{a}+{b}=", f"{b}+{a}=", f"What is {a}+{b}?", f"{a} + {b} ="]
    # TRL's GRPO over each paraphrase group of 4 (unbiased std, eps 1e-4), on the rows the loss sees
    r = torch.tensor(call["rewards"]).view(-1, 4)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    want = Counter((_rendered(trainer.processing_class, p), round(a, 4))
                   for p, a in zip(call["prompts"], expected.tolist()))
    assert _rows_with_advantages(trainer, inputs) == want
    base_prompts = {trainer.processing_class.decode(p[m.bool()])
                    for p, m in zip(base_inputs["prompt_ids"], base_inputs["prompt_mask"])}
    assert not any("What is" in p for p in base_prompts)  # plain GRPO on the same data: only the `prompt` column
    assert trainer._metrics["train"]["groupx/consistency_grpo_variants_per_row"] == [4.0]
    assert grads_differ(base_grads, grads)


def asks_a_question(prompts, completions, **kwargs):
    """1 for a rollout whose prompt is the question phrasing, else 0: a reward that depends only on the phrasing."""
    return [float("What is" in p[-1]["content"]) for p in prompts]


def test_advantages_are_normalised_over_the_paraphrase_group(tmp_path):
    """Only the question (variant 2) scores 1: every group is r = [0, 0, 1, 0], mean 1/4, unbiased std
    sqrt((3·(1/4)² + (3/4)²) / 3) = 1/2, so A = [-1/4, -1/4, 3/4, -1/4] / (1/2 + 1e-4) = [-0.4999, ..., 1.4997, ...].
    Plain GRPO on the same rows generates only from "a+b=": every reward 0, every advantage 0, no gradient."""
    trainer = trainer_for(tmp_path / "cg", reward=asks_a_question, **FLAGS)
    _, grads, inputs = one_step(trainer)
    low, high = -0.25 / 0.5001, 0.75 / 0.5001
    tok = trainer.processing_class
    for p, m, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["advantages"].tolist()):
        assert a == pytest.approx(high if "What is" in tok.decode(p[m.bool()]) else low, abs=1e-5)
    assert sorted(round(a, 4) for a in inputs["advantages"].tolist()) == [round(low, 4)] * 6 + [round(high, 4)] * 2
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", reward=asks_a_question))
    assert base_inputs["advantages"].abs().sum() == 0 and all(g.abs().sum() == 0 for g in base_grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_fewer_variants_cycle_and_text_prompts(tmp_path):
    data = paraphrase_dataset(text=True).map(lambda r: {"paraphrases": r["paraphrases"][:2]})
    reward = RecordingReward()
    trainer = trainer_for(tmp_path, reward=reward, dataset=data, **FLAGS)
    _, _, inputs = one_step(trainer)
    (call,) = reward.calls
    _check_groups(call)
    a, b = call["prompts"][0][:-1].split("+")
    assert call["prompts"][:4] == [f"{a}+{b}=", f"{b}+{a}="] * 2 and call["variants"] == [0, 1, 0, 1] * 2
    tok = trainer.processing_class
    assert Counter(tok.decode(p[m.bool()]) for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])) == Counter(
        call["prompts"])


def test_evaluation_is_not_rewritten(tmp_path):
    reward = RecordingReward()
    trainer = trainer_for(tmp_path, reward=reward, **FLAGS)
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)
    (call,) = reward.calls
    assert call["prompts"] == [row["prompt"] for row in batch] and call["variants"] is None
    assert all(p[-1]["content"].endswith("=") and " " not in p[-1]["content"] for p in call["prompts"])


def test_composes_with_rloo(tmp_path):
    reward = RecordingReward()
    trainer = trainer_for(tmp_path, reward=reward, advantage_estimator="rloo", **FLAGS)
    _, grads, inputs = one_step(trainer)
    (call,) = reward.calls
    _check_groups(call)
    expected = rloo_advantages(torch.tensor(call["rewards"]), 4)
    want = Counter((_rendered(trainer.processing_class, p), round(a, 4))
                   for p, a in zip(call["prompts"], expected.tolist()))
    assert _rows_with_advantages(trainer, inputs) == want and any(g.abs().sum() > 0 for g in grads.values())


def test_stability_reward_compares_each_paraphrase_group(tmp_path):
    """stability_reward reads the paraphrase_id the rewrite sets: each completion's reward is
    1 − (−log p_i)/log 4, p_i the share of its paraphrase group with its (normalised) answer, recomputed here."""
    reward = RecordingReward(stability_reward, "stability_reward")
    trainer = trainer_for(tmp_path, reward=reward, max_completion_length=4, temperature=0.3, **FLAGS)
    _, grads, inputs = one_step(trainer)
    (call,) = reward.calls
    _check_groups(call)
    answers = [normalize_text(answer_text(c[-1]["content"], "answer")) for c in call["completions"]]
    expected = []
    for r, answer in enumerate(answers):
        group = answers[r - r % 4: r - r % 4 + 4]
        expected.append(1.0 - (-math.log(group.count(answer) / 4)) / math.log(4))
    assert call["rewards"] == pytest.approx(expected)
    # the toy answers "a+b=" and "b+a=" alike and the other phrasings differently: two agree, p = 1/2, r = 1/2
    assert 0.5 in call["rewards"] and 0.0 in call["rewards"]
    r = torch.tensor(call["rewards"]).view(-1, 4)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    want = Counter((_rendered(trainer.processing_class, p), round(a, 4)) for p, a in zip(call["prompts"], adv.tolist()))
    assert _rows_with_advantages(trainer, inputs) == want


def test_bad_datasets_are_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"consistency_grpo_column='paraphrases', which it does not have.*Add a "
                                         r"column"):
        trainer_for(tmp_path / "a", dataset=arithmetic_dataset(16), **FLAGS)
    five = paraphrase_dataset(16).map(lambda r: {"paraphrases": r["paraphrases"] + [r["prompt"]]})
    with pytest.raises(ValueError, match=r"5 prompt variants.*num_generations=4.*num_generations >= 5"):
        trainer_for(tmp_path / "b", dataset=five, **FLAGS)
    trainer_for(tmp_path / "b8", dataset=five, num_generations=8, **FLAGS)  # 5 variants, G = 8: cycled, accepted
    empty = paraphrase_dataset(16).map(lambda r, i: {"paraphrases": [] if i == 7 else r["paraphrases"]},
                                       with_indices=True)
    with pytest.raises(ValueError, match="at least one prompt variant"):
        trainer_for(tmp_path / "c", dataset=empty, **FLAGS)
    strings = paraphrase_dataset(16).map(lambda r: {"paraphrases": "2+3="})
    with pytest.raises(ValueError, match=r"holds string, not lists of prompt variants"):
        trainer_for(tmp_path / "d", dataset=strings, **FLAGS)
    mixed = paraphrase_dataset(16, text=True).map(lambda r: {"paraphrases": [[{"role": "user", "content": "x"}]]})
    with pytest.raises(ValueError, match="row 0 has a text prompt"):
        trainer_for(tmp_path / "e", dataset=mixed, **FLAGS)
    other = paraphrase_dataset(16).rename_column("paraphrases", "variants")
    trainer_for(tmp_path / "f", dataset=other, consistency_grpo_column="variants", **FLAGS)


def test_a_malformed_cell_is_refused_at_the_first_batch(tmp_path):
    """Rows are checked batch by batch before generation (an iterable dataset's cells are not read at
    construction: only its column names are)."""
    data = paraphrase_dataset(16)
    with pytest.raises(ValueError, match="consistency_grpo_column='paraphrases', which it does not have"):
        trainer_for(tmp_path / "a", dataset=arithmetic_dataset(16).to_iterable_dataset(), max_steps=1, **FLAGS)
    trainer_for(tmp_path / "b", dataset=data.to_iterable_dataset(), **FLAGS)
    trainer = trainer_for(tmp_path / "c", dataset=data, **FLAGS)
    trainer.model.train()
    rows = [dict(data[i]) for i in range(4) for _ in range(4)]
    for row in rows[12:]:
        row["paraphrases"] = ["12+13="]  # a string variant for a conversational prompt
    with pytest.raises(ValueError, match=r"row 12 has a conversational prompt.*'12\+13='.*consistency_grpo_column"):
        trainer._generate_and_score_completions(rows)


def test_tokenizer_sees_each_variant_as_its_own_conversation(tmp_path):
    """Context reset: a rollout's prompt ids are exactly its variant's chat template, nothing of another variant."""
    reward = RecordingReward()
    trainer = trainer_for(tmp_path, reward=reward, **FLAGS)
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    tok = load_tiny_tokenizer()
    (call,) = reward.calls
    for p, m, prompt in zip(output["prompt_ids"], output["prompt_mask"], call["prompts"]):
        assert tok.decode(p[m.bool()]) == _rendered(tok, prompt)
        assert tok.decode(p[m.bool()]).count("<|im_start|>user") == 1


@needs_torchrun
def test_two_processes_assign_split_groups_from_global_rows(tmp_path):
    launch(Path(__file__).with_name("consistency_grpo_mp_worker.py"), tmp_path)
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["rows_match_one_process"] and r["ids_are_global_groups"] and r["advantages_are_grpo"], r
        assert r["group_prompts"] == r["expected_group_prompts"], r


def test_dataset_fixture_has_four_variants():
    assert isinstance(paraphrase_dataset(2), Dataset) and len(paraphrase_dataset(2)[0]["paraphrases"]) == 4
