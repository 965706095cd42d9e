"""MOTIF's multi-round rollout (`trl_groupx/rollouts/multi_round.py`) through the trainer on the shipped tiny model:
the catalog check at k=2 (round 2's prompt holds round 1's output, the reward is computed once per rollout, the
loss covers only the model's round-1 tokens), one real step full and LoRA whose gradient differs from the
single-round run, the official base-model futures, and a composition with an advantage variant."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.rollouts.multi_round import extract_answer, make_multi_round_rollout, round_messages

PEFT = [False, True]


def final_parity(completions, multi_round_final, **kwargs) -> list[float]:
    """Mean over a row's futures of the last character's code-point parity of the final round (mixes in groups)."""
    return [sum(ord(f[-1]) % 2 if f else 0 for f in finals) / len(finals) for finals in multi_round_final]


class CountingReward:
    """final_parity that records each call's rows."""

    __name__ = "counting_final_parity"

    def __init__(self):
        self.calls = []

    def __call__(self, completions, multi_round_final, **kwargs):
        self.calls.append([list(f) for f in multi_round_final])
        return final_parity(completions, multi_round_final)


class GenerateSpy:
    """Records every `generate` call of the policy: the unpadded inputs and the generated continuations."""

    def __init__(self, model, pad_id: int):
        self.model, self.orig, self.pad, self.calls = model, model.generate, pad_id, []
        model.generate = self

    def __call__(self, input_ids, attention_mask, **kwargs):
        out = self.orig(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        width = input_ids.shape[1]
        prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
        self.calls.append((prompts, out[:, width:].tolist()))
        return out


class Capture:
    """The trainer's generation output before TRL shuffles it into micro-batches."""

    def __init__(self, trainer):
        self.orig = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self

    def __call__(self, inputs):
        self.output = self.orig(inputs)
        return self.output


def trainer_for(tmp_path, rollout, peft=False, reward=final_parity, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=reward,
                         rollout_func=rollout, **flags)


def _cut(tokens, eos):
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.mark.parametrize("peft", PEFT)
def test_catalog_check_two_rounds(tmp_path, peft):
    reward = CountingReward()
    trainer = trainer_for(tmp_path, make_multi_round_rollout(num_rounds=2, num_futures=2, max_round_tokens=5),
                          peft=peft, reward=reward)
    tok = trainer.processing_class
    spy = GenerateSpy(trainer.accelerator.unwrap_model(trainer.model), tok.pad_token_id)
    capture = Capture(trainer)
    one_step(trainer)
    out = capture.output
    assert len(spy.calls) == 2  # round 1 (8 rows), then round 2 (8 rows x 2 futures) in one batch
    (r1_prompts, r1_out), (r2_prompts, r2_out) = spy.calls
    assert len(r1_prompts) == 8 and len(r2_prompts) == 16
    first = [_cut(t, tok.eos_token_id) for t in r1_out]
    first_text = tok.batch_decode(first, skip_special_tokens=True)
    # round 2's prompt holds round 1's output: row i's futures are generated from the question + its carried text
    batch_prompts = [tok.decode(p) for p in r1_prompts]
    for f, ids in enumerate(r2_prompts):
        i = f // 2
        question = batch_prompts[i].split("user\n")[1].split("<|im_end|>")[0]
        expected = round_messages([{"role": "user", "content": question}], extract_answer(first_text[i]), 1, 2)
        assert ids == tok.apply_chat_template(expected, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert f'Progress in round 1: "{first_text[i].strip()}"' in tok.decode(ids)
    assert any(t.strip() for t in first_text)  # the carried texts are not all empty
    # the reward is computed once per rollout, on the futures' final rounds
    assert len(reward.calls) == 1 and len(reward.calls[0]) == 8
    finals = tok.batch_decode([_cut(t, tok.eos_token_id) for t in r2_out], skip_special_tokens=True)
    assert reward.calls[0] == [finals[2 * i: 2 * i + 2] for i in range(8)]
    # the loss covers exactly round 1's model tokens: completion_ids are round 1, the mask is 1 on each of them
    mask = out["completion_mask"]
    assert out.get("tool_mask") is None
    assert mask.sum(1).tolist() == [len(t) for t in first]
    assert [row[m.bool()].tolist() for row, m in zip(out["completion_ids"], mask)] == first


@pytest.mark.parametrize("peft", PEFT)
def test_gradient_differs_from_the_single_round_run(tmp_path, peft):
    runs = {}
    for k in (1, 2):
        trainer = trainer_for(tmp_path / str(k), make_multi_round_rollout(num_rounds=k, num_futures=2,
                                                                          max_round_tokens=5), peft=peft)
        capture = Capture(trainer)
        _, grads, _ = one_step(trainer)
        runs[k] = grads, capture.output
    (g1, o1), (g2, o2) = runs[1], runs[2]
    # same round-1 completions (sampled first, same seed): the difference comes from the later round's outcome
    assert torch.equal(o1["completion_ids"], o2["completion_ids"])
    assert not torch.equal(o1["advantages"], o2["advantages"])
    assert any(g.abs().sum() > 0 for g in g2.values())
    assert grads_differ(g1, g2)


def test_composes_with_an_advantage_variant(tmp_path):
    grads = {}
    for name, flags in (("grpo", {}), ("rloo", {"advantage_estimator": "rloo"})):
        trainer = trainer_for(tmp_path / name, make_multi_round_rollout(num_rounds=2, num_futures=2,
                                                                        max_round_tokens=5), **flags)
        _, grads[name], _ = one_step(trainer)
    assert grads_differ(grads["grpo"], grads["rloo"])


def test_base_futures_disable_the_adapter_only_for_later_rounds(tmp_path):
    trainer = trainer_for(tmp_path, make_multi_round_rollout(num_rounds=3, num_futures=2, max_round_tokens=4,
                                                             future_model="base"), peft=True)
    model = trainer.accelerator.unwrap_model(trainer.model)
    entered, orig = [], model.disable_adapter

    def recording_disable_adapter():
        entered.append(True)
        return orig()

    model.disable_adapter = recording_disable_adapter
    one_step(trainer)
    assert len(entered) == 2  # rounds 2 and 3; round 1 (the trained one) is the policy's


def test_base_futures_need_an_adapter(tmp_path):
    trainer = trainer_for(tmp_path, make_multi_round_rollout(num_rounds=2, future_model="base"))
    with pytest.raises(ValueError, match="future_model='base'.*peft_config"):
        one_step(trainer)
