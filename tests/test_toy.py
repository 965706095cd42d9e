"""The shipped toy setup: tokenizer, tiny model, arithmetic dataset/reward, and the asset build script."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from trl_groupx.toy import (
    TINY_MODEL_DIR,
    arithmetic_dataset,
    arithmetic_reward,
    load_tiny_model,
    load_tiny_tokenizer,
    tiny_model_path,
)

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_tiny_model.py"


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    m = load_tiny_model()
    m.eval()
    return m


def _generate(model, tok, dataset, do_sample: bool, num_return_sequences: int = 1) -> list[str]:
    enc = tok.apply_chat_template(
        list(dataset["prompt"]), add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding=True,
    )
    kwargs = dict(temperature=1.0, top_k=0, top_p=1.0) if do_sample else {}
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=6,
            do_sample=do_sample,
            num_return_sequences=num_return_sequences,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            **kwargs,
        )
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


# --- assets and tokenizer -------------------------------------------------------------------------------------


def test_shipped_files_exist_and_are_small():
    assert Path(tiny_model_path()) == TINY_MODEL_DIR
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (TINY_MODEL_DIR / name).is_file(), name
    assert (TINY_MODEL_DIR / "model.safetensors").stat().st_size < 2_000_000


def test_tokenizer_round_trip(tok):
    ids = tok("12+7=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5  # one token per character
    assert tok.decode(ids) == "12+7="
    assert tok.decode(tok("hello world 42\n", add_special_tokens=False)["input_ids"]) == "hello world 42\n"


def test_tokenizer_special_tokens(tok):
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token is not None and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    ids = tok("19<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "19"


def test_chat_template(tok):
    messages = [{"role": "user", "content": "12+7="}]
    with_prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    without = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert without == "<|im_start|>user\n12+7=<|im_end|>\n"
    assert with_prompt == without + "<|im_start|>assistant\n"
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": "19"}], tokenize=False)
    assert full == with_prompt + "19<|im_end|>\n"
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert tok.decode(ids) == with_prompt


# --- model ----------------------------------------------------------------------------------------------------


def test_model_forward(model, tok):
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    enc = tok.apply_chat_template(
        [[{"role": "user", "content": "3+4="}], [{"role": "user", "content": "13+14="}]],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding=True,
    )
    assert (enc["attention_mask"][1] == 1).all() and enc["attention_mask"][0, 0] == 0  # left padding
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (*enc["input_ids"].shape, len(tok))
    assert torch.isfinite(logits).all()


def test_shipped_model_is_partly_right(model, tok):
    """Greedy decoding is (nearly) always right; sampling at temperature 1.0 only partly (~0.28 measured on 256
    samples), so GRPO groups get mixed rewards. Catches an accidental rebuild that is trivial or broken."""
    ds = arithmetic_dataset(64, seed=1234)
    greedy = arithmetic_reward(_generate(model, tok, ds, do_sample=False), ds["answer"])
    assert sum(greedy) / len(greedy) >= 0.9
    torch.manual_seed(0)
    sampled = arithmetic_reward(
        _generate(model, tok, ds, do_sample=True, num_return_sequences=4), [a for a in ds["answer"] for _ in range(4)]
    )
    assert 0.1 <= sum(sampled) / len(sampled) <= 0.55
    # Operands up to 40 (trained up to 20): some-but-not-all right greedily (0.36 measured).
    ood = arithmetic_dataset(64, seed=5, max_operand=40)
    ood_greedy = arithmetic_reward(_generate(model, tok, ood, do_sample=False), ood["answer"])
    assert 0.1 <= sum(ood_greedy) / len(ood_greedy) <= 0.8


# --- dataset and reward ---------------------------------------------------------------------------------------


def test_dataset_deterministic_and_correct():
    a, b = arithmetic_dataset(50, seed=3), arithmetic_dataset(50, seed=3)
    assert a.column_names == ["prompt", "answer"]
    assert a["prompt"] == b["prompt"] and a["answer"] == b["answer"]
    assert arithmetic_dataset(50, seed=4)["prompt"] != a["prompt"]
    for prompt, answer in zip(a["prompt"], a["answer"]):
        assert len(prompt) == 1 and prompt[0]["role"] == "user"
        question = prompt[0]["content"]
        assert question.endswith("=") and isinstance(answer, str)
        x, y = question[:-1].split("+")
        assert 0 <= int(x) <= 20 and 0 <= int(y) <= 20
        assert int(answer) == int(x) + int(y)


@pytest.mark.parametrize("ops", ["-", "*", "+-*"])
def test_dataset_other_ops(ops):
    ds = arithmetic_dataset(40, seed=0, max_operand=9, ops=ops)
    for prompt, answer in zip(ds["prompt"], ds["answer"]):
        assert eval(prompt[0]["content"][:-1]) == int(answer)  # noqa: S307 - digits and one operator only
        assert int(answer) >= 0


def test_dataset_rejects_unknown_op():
    with pytest.raises(ValueError):
        arithmetic_dataset(4, ops="/")


def test_reward_hand_examples():
    conv = [[{"role": "assistant", "content": c}] for c in ["19", " 19 \n", "18", "nineteen", "", "19 apples", "019"]]
    assert arithmetic_reward(conv, ["19"] * 7) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    plain = ["5", "5\n", "-3", "+5", "5.0", "x"]
    assert arithmetic_reward(plain, ["5", "5", "-3", "5", "5", "5"]) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert arithmetic_reward([], []) == []
    rewards = arithmetic_reward(["1"], ["1"], prompts=[[{"role": "user", "content": "0+1="}]], trainer_state=None)
    assert rewards == [1.0] and all(isinstance(r, float) for r in rewards)


# --- build script ---------------------------------------------------------------------------------------------


def test_build_script_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("build_tiny_model", BUILD_SCRIPT)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    out = tmp_path / "tiny"
    build.main(["--out", str(out), "--steps", "3", "--batch-size", "8", "--eval-size", "4"])

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    shipped = load_tiny_tokenizer()
    assert tok.get_vocab() == shipped.get_vocab()
    assert tok.chat_template == shipped.chat_template
    assert model.config.vocab_size == len(tok)
    with torch.no_grad():
        logits = model(**tok("1+1=", return_tensors="pt")).logits
    assert torch.isfinite(logits).all()
    info = json.loads((out / "build_info.json").read_text())
    assert info["steps"] == 3 and not math.isnan(info["sampled_accuracy"])
