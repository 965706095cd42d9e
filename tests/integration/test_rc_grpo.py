"""RC-GRPO on the tiny model (its character-level tokenizer given the two reward tokens by `add_condition_tokens`,
a stand-in for an RCTP checkpoint): every training group carries the tokens in the configured ratio, the token ids
are in the prompt and never under the completion mask, the update differs from plain GRPO on the same model (full
and LoRA), evaluation prompts carry no token, runs are reproducible, the multi-turn rollout_func path and an
advantage variant compose with it, and a policy without the tokens is refused at construction."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from peft import LoraConfig

import trl_groupx
from tests.conftest import base_config_kwargs, grads_differ, one_step, parity_reward
from tests.integration.torchrun import launch, needs_torchrun
from trl_groupx.advantages import rloo_advantages
from trl_groupx.sampling.rc_grpo import HIGH_REWARD_TOKEN, LOW_REWARD_TOKEN, row_conditions
from trl_groupx.sampling.rctp import add_condition_tokens
from trl_groupx.toy import arithmetic_dataset, load_tiny_model, load_tiny_tokenizer
from trl_groupx.toy.counter_rollout import counter_outcome_reward, make_counter_game_rollout

TOKENS = [HIGH_REWARD_TOKEN, LOW_REWARD_TOKEN]


class RecordingReward:
    """parity_reward that remembers each call's prompts, rewards and condition column."""

    __name__ = "parity_reward"

    def __init__(self, inner=parity_reward):
        self.calls, self.inner = [], inner

    def __call__(self, prompts, completions, **kwargs):
        rewards = self.inner(completions=completions, **kwargs)
        self.calls.append(dict(prompts=prompts, rewards=rewards, conditions=kwargs.get("rc_grpo_condition")))
        return rewards


def rctp_trainer(tmp_path, peft=False, reward=None, tokens=True, resize=True, rollout_func=None, **flags):
    """The tiny model with the reward tokens added (tokens=False: the plain tiny tokenizer; resize=False: the
    tokenizer knows them, the model was not resized)."""
    tokenizer, model = load_tiny_tokenizer(), load_tiny_model()
    if tokens:
        torch.manual_seed(0)  # the new embedding rows are drawn at random: the same rows in every trainer
        add_condition_tokens(tokenizer, model if resize else None)
    args = trl_groupx.GRPOConfig(**base_config_kwargs(tmp_path, **flags))
    return trl_groupx.GRPOTrainer(
        model=model, reward_funcs=reward or parity_reward, train_dataset=arithmetic_dataset(64, seed=0),
        processing_class=tokenizer, args=args,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear") if peft else None,
        **({"rollout_func": rollout_func} if rollout_func is not None else {}),
    )


def _user(prompt):
    return prompt[-1]["content"] if isinstance(prompt, list) else prompt


def _check_groups(call, group_size, want_counts):
    """Every group: one original prompt, each row's prompt ending with its token, the tokens in `want_counts`."""
    n = len(call["prompts"])
    for g in range(n // group_size):
        rows = range(g * group_size, (g + 1) * group_size)
        conditions = [call["conditions"][i] for i in rows]
        assert sorted(Counter(conditions).values()) in want_counts, conditions
        originals = {_user(call["prompts"][i])[: -len(call["conditions"][i])] for i in rows}
        assert len(originals) == 1
        assert all(_user(call["prompts"][i]).endswith(call["conditions"][i]) for i in rows)


def _token_counts(inputs, ids):
    """Per row: condition-token ids among the real prompt tokens, and among the completion tokens under the loss
    mask (completion mask times tool mask, as TRL's loss reads them)."""
    ids = torch.tensor(ids)
    loss_mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
    in_prompt = (torch.isin(inputs["prompt_ids"], ids) & inputs["prompt_mask"].bool()).sum(1)
    in_completion = (torch.isin(inputs["completion_ids"], ids) & loss_mask.bool()).sum(1)
    return in_prompt, in_completion


@pytest.mark.parametrize("peft", [False, True])
def test_groups_carry_the_tokens_and_the_update_differs(tmp_path, peft):
    _, base_grads, base_inputs = one_step(rctp_trainer(tmp_path / "base", peft))
    reward = RecordingReward()
    trainer = rctp_trainer(tmp_path / "rc", peft, reward=reward, rollout_filter="rc_grpo")
    _, grads, inputs = one_step(trainer)
    (call,) = reward.calls
    _check_groups(call, 4, [[2, 2]])  # G = 4 at [0.5, 0.5]: two of each, every group
    ids = trainer.processing_class.convert_tokens_to_ids(TOKENS)
    in_prompt, in_completion = _token_counts(inputs, ids)
    assert in_prompt.tolist() == [1] * 8 and in_completion.tolist() == [0] * 8
    assert _token_counts(base_inputs, ids)[0].tolist() == [0] * 8  # plain GRPO on the same model: no token
    # the rows the loss sees: each prompt's token is its recorded condition, the advantages are TRL's GRPO
    r = torch.tensor(call["rewards"]).view(-1, 4)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    tok = trainer.processing_class
    want = Counter((tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), round(a, 5))
                   for p, a in zip(call["prompts"], expected.tolist()))
    got = Counter((tok.decode(p[m.bool()]), round(a, 5))
                  for p, m, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["advantages"].tolist()))
    assert got == want
    assert trainer._metrics["train"]["groupx/rc_grpo_share_0"] == [0.5]
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("group_size,want", [(3, [[1, 2]]), (2, [[1, 1]]), (5, [[2, 3]])])
def test_odd_groups_and_pairs(tmp_path, group_size, want):
    reward = RecordingReward()
    trainer = rctp_trainer(tmp_path, reward=reward, rollout_filter="rc_grpo", num_generations=group_size,
                           per_device_train_batch_size=group_size * 2)
    one_step(trainer)
    _check_groups(reward.calls[0], group_size, want)


def test_other_mix_and_tokens(tmp_path):
    reward = RecordingReward()
    tokens = ["<|high_reward|>", "<|low_reward|>"]
    trainer = rctp_trainer(tmp_path, reward=reward, rollout_filter="rc_grpo", rc_grpo_condition_mix=[0.25, 0.75],
                           rc_grpo_prompt_condition_tokens=tokens)
    one_step(trainer)
    for g in range(2):
        assert Counter(reward.calls[0]["conditions"][4 * g:4 * g + 4]) == {tokens[0]: 1, tokens[1]: 3}


def test_evaluation_prompts_carry_no_token(tmp_path):
    reward = RecordingReward()
    trainer = rctp_trainer(tmp_path, reward=reward, rollout_filter="rc_grpo")
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(batch)
    (call,) = reward.calls
    assert call["conditions"] is None
    assert not any(t in _user(p) for p in call["prompts"] for t in TOKENS)
    ids = trainer.processing_class.convert_tokens_to_ids(TOKENS)
    assert _token_counts(output, ids)[0].tolist() == [0] * 8


def test_same_seed_and_step_draw_the_same_tokens(tmp_path):
    draws = []
    for name, seed in (("a", 0), ("b", 0), ("c", 3)):
        reward = RecordingReward()
        trainer = rctp_trainer(tmp_path / name, reward=reward, rollout_filter="rc_grpo", seed=seed,
                               per_device_train_batch_size=32)
        one_step(trainer)
        draws.append(reward.calls[0]["conditions"])
        k = row_conditions([0.5, 0.5], 4, 0, 32, seed=seed, step=0)  # what the seeded draw promises
        assert draws[-1] == [TOKENS[i] for i in k]
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_each_step_draws_with_its_own_step(tmp_path):
    """Two real training steps: the second generation's tokens are the seeded draw at step 1, not step 0's again."""
    reward = RecordingReward()
    trainer = rctp_trainer(tmp_path, reward=reward, rollout_filter="rc_grpo", max_steps=2,
                           per_device_train_batch_size=32)
    trainer.train()
    assert len(reward.calls) == 2
    for step, call in enumerate(reward.calls):
        assert call["conditions"] == [TOKENS[k] for k in row_conditions([0.5, 0.5], 4, 0, 32, seed=0, step=step)]
    assert reward.calls[0]["conditions"] != reward.calls[1]["conditions"]


def test_composes_with_rloo(tmp_path):
    reward = RecordingReward()
    trainer = rctp_trainer(tmp_path, reward=reward, rollout_filter="rc_grpo", advantage_estimator="rloo")
    _, grads, inputs = one_step(trainer)
    (call,) = reward.calls
    _check_groups(call, 4, [[2, 2]])
    expected = rloo_advantages(torch.tensor(call["rewards"]), 4)
    tok = trainer.processing_class
    want = Counter((tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), round(a, 5))
                   for p, a in zip(call["prompts"], expected.tolist()))
    got = Counter((tok.decode(p[m.bool()]), round(a, 5))
                  for p, m, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["advantages"].tolist()))
    assert got == want and any(g.abs().sum() > 0 for g in grads.values())


def test_multi_turn_rollout_with_gigpo(tmp_path):
    """The counter game through TRL's rollout_func (issue 8): the rollout receives the conditioned prompts, the
    token stays out of the multi-turn completion, and GiGPO's step credit trains on it."""
    flags = dict(advantage_estimator="gigpo", max_completion_length=64, loss_type="grpo")
    _, base_grads, _ = one_step(rctp_trainer(tmp_path / "base", reward=counter_outcome_reward,
                                             rollout_func=make_counter_game_rollout(), **flags))
    reward = RecordingReward(counter_outcome_reward)
    trainer = rctp_trainer(tmp_path / "rc", reward=reward, rollout_func=make_counter_game_rollout(),
                           rollout_filter="rc_grpo", **flags)
    _, grads, inputs = one_step(trainer)
    _check_groups(reward.calls[0], 4, [[2, 2]])
    in_prompt, in_completion = _token_counts(inputs, trainer.processing_class.convert_tokens_to_ids(TOKENS))
    assert in_prompt.tolist() == [1] * 8 and in_completion.tolist() == [0] * 8
    assert grads_differ(base_grads, grads)


def test_condition_tokens_sampled_in_a_completion_get_no_loss(tmp_path):
    """A completion that samples a reward token: 0 in the tool mask at that position only (still attended: the
    completion mask is unchanged), num_items_in_batch recounted, the share logged."""
    trainer = rctp_trainer(tmp_path, rollout_filter="rc_grpo")
    trainer.model.train()
    high, low = trainer.processing_class.convert_tokens_to_ids(TOKENS)
    completion_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    output = {"completion_ids": torch.tensor([[5, high, 7, low], [low, 8, 9, 2]]),  # row 0's `low` is padding
              "completion_mask": completion_mask.clone(), "num_items_in_batch": torch.tensor(7)}
    from trl_groupx.sampling.reward_tokens import mask_condition_tokens

    mask_condition_tokens(trainer, output)
    assert output["tool_mask"].tolist() == [[1, 0, 1, 1], [0, 1, 1, 1]]
    assert torch.equal(output["completion_mask"], completion_mask)
    assert output["num_items_in_batch"].item() == 5  # 7 loss tokens, 2 of them sampled reward tokens
    assert trainer._metrics["train"]["groupx/rc_grpo_sampled_condition_token_fraction"] == [pytest.approx(2 / 7)]
    # an existing tool mask (multi-turn tool output) is kept and multiplied
    output = {"completion_ids": torch.tensor([[high, 5, 6]]), "completion_mask": torch.ones(1, 3, dtype=torch.long),
              "tool_mask": torch.tensor([[1, 0, 1]])}
    mask_condition_tokens(trainer, output)
    assert output["tool_mask"].tolist() == [[0, 0, 1]] and output["num_items_in_batch"].item() == 1


def test_a_policy_without_the_tokens_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"rc_grpo_prompt_condition_tokens entry '<\|high_reward\|>' is 15 "
                                         r"token\(s\).*add_condition_tokens.*reward_conditioned_sft_rows"):
        rctp_trainer(tmp_path / "a", tokens=False, rollout_filter="rc_grpo")
    with pytest.raises(ValueError, match="beyond the model's 104 embedding rows"):
        rctp_trainer(tmp_path / "b", resize=False, rollout_filter="rc_grpo")
    with pytest.raises(ValueError, match="rc_grpo_prompt_condition_tokens entry '<other>'"):
        rctp_trainer(tmp_path / "c", rollout_filter="rc_grpo", rc_grpo_prompt_condition_tokens=[HIGH_REWARD_TOKEN,
                                                                                                  "<other>"])


def test_rctp_rows_train_with_trl_sft(tmp_path):
    """Stage 1 as the docstring describes it: the rows go through TRL's SFTTrainer (prompt-completion), where each
    reward token is one input id, never a label, and one step trains its embedding row."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trl_groupx.sampling.rctp import reward_conditioned_sft_rows

    tokenizer, model = load_tiny_tokenizer(), load_tiny_model()
    ids = add_condition_tokens(tokenizer, model)
    trajectories = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}],
                     "completion": [{"role": "assistant", "content": str(2 * a)}], "reward": float(a % 2)}
                    for a in range(8)]
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, per_device_train_batch_size=8,
                     report_to="none", save_strategy="no", learning_rate=1e-3, max_length=64, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=args, processing_class=tokenizer,
                         train_dataset=Dataset.from_list(reward_conditioned_sft_rows(trajectories, threshold=1.0)))
    for a, row in enumerate(trainer.train_dataset):
        token = ids[0] if a % 2 else ids[1]  # odd a: reward 1 >= threshold -> high
        assert row["input_ids"].count(token) == 1 and not set(ids) & set(row["labels"])
    before = model.get_input_embeddings().weight[ids].detach().clone()
    trainer.train()
    assert not torch.equal(model.get_input_embeddings().weight[ids], before)


@needs_torchrun
def test_two_processes_agree_on_split_groups(tmp_path):
    launch(Path(__file__).with_name("rc_grpo_mp_worker.py"), tmp_path)
    results = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
    assert len(results) == 4
    for r in results:
        assert r["counts_per_group"] == r["expected_counts"], r
        assert r["rows_match_the_seeded_draw"] and r["one_token_per_prompt"], r
