#!/usr/bin/env python
"""Build the tiny arithmetic model shipped in ``trl_groupx/toy/assets/tiny-arith/``.

Everything is built from scratch and deterministically (fixed seeds, deterministic torch algorithms,
fixed thread count), fully offline:

1. a character-level tokenizer (``tokenizers`` BPE model with no merges, i.e. one token per character)
   with ChatML special tokens, wrapped in ``transformers.PreTrainedTokenizerFast``;
2. a small Llama-architecture causal LM (hidden 64, 4 layers, tied embeddings, 0.27M parameters, ~1.1 MB of
   float32 safetensors);
3. a short plain-PyTorch SFT loop on chat-formatted problems (user ``"12+7="`` -> assistant ``"19"``, operands
   0..20), trained until greedy decoding is right;
4. a baked-in sampling temperature (final RMSNorm weight divided by ``--bake-temperature``, 2.75): sampling at
   temperature 1.0 then solves only ~28% of the problems, so GRPO groups get mixed rewards and a consistent
   "sharpen" signal. (A merely under-trained model was tried first: its sampled accuracy was in range too, but
   GRPO on it was noisy and often collapsed; the converged-then-flattened model improves steadily.)

Usage::

    python scripts/build_tiny_model.py                     # rebuild the shipped assets (~2 min on one core)
    python scripts/build_tiny_model.py --out /tmp/x --steps 5   # quick smoke build
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "trl_groupx" / "toy" / "assets" / "tiny-arith"

PAD, BOS, EOS, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
ROLE_TOKENS = ["system", "user", "assistant"]
CHARS = ["\n", "\t"] + [chr(c) for c in range(32, 127)]  # newline, tab and printable ASCII
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():
    """Character-level tokenizer: specials, role words (as added tokens), then one token per ASCII char."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK] + CHARS)}
    # BPE without merges == split into characters, unknown characters map to <unk>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=True))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, BOS, EOS, UNK)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ROLE_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=64,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.add_bos_token = False
    return tok


def build_model(vocab_size: int, eos_id: int, pad_id: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_cache=True,
    )
    # Llama rather than Qwen2: for model_type "qwen2" AutoTokenizer forces Qwen2Tokenizer, which replaces the
    # character-level pre-tokenizer/decoder with byte-level ones; for "llama" it loads tokenizer.json as saved.
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    return model


def sample_problem(rng: random.Random, max_operand: int, ops: str) -> tuple[str, str]:
    """Same convention as ``trl_groupx.toy.arithmetic_dataset`` (subtraction never goes negative)."""
    a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
    if op == "-" and b > a:
        a, b = b, a
    result = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a}{op}{b}=", str(result)


def encode_example(tok, question: str, answer: str) -> tuple[list[int], list[int]]:
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(answer + EOS, add_special_tokens=False)["input_ids"]
    return p_ids + a_ids, [-100] * len(p_ids) + a_ids


def make_batch(tok, rng: random.Random, batch_size: int, max_operand: int, ops: str):
    examples = [encode_example(tok, *sample_problem(rng, max_operand, ops)) for _ in range(batch_size)]
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((batch_size, width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
    for i, (ids, lab) in enumerate(examples):  # right padding for training
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(ids)] = 1
    return input_ids, attention_mask, labels


@torch.no_grad()
def evaluate(model, tok, problems: list[tuple[str, str]], do_sample: bool, seed: int = 0) -> float:
    """Exact-match accuracy of the model's completions (greedy or sampled at temperature 1.0)."""
    model.eval()
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q, _ in problems
    ]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    out = model.generate(
        **enc,
        max_new_tokens=8,
        do_sample=do_sample,
        temperature=1.0 if do_sample else None,
        top_k=0 if do_sample else None,
        top_p=1.0 if do_sample else None,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train()
    return sum(t.strip() == a for t, (_, a) in zip(texts, problems)) / len(problems)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: the shipped assets)")
    parser.add_argument("--steps", type=int, default=1000, help="SFT optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-operand", type=int, default=20)
    parser.add_argument("--ops", default="+")
    parser.add_argument("--bake-temperature", type=float, default=2.75, help="divide final norm weight by this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (fixed for reproducibility)")
    parser.add_argument("--eval-every", type=int, default=0, help="print accuracy every N steps (0: only at end)")
    parser.add_argument("--eval-size", type=int, default=256)
    args = parser.parse_args(argv)

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    tok = build_tokenizer()
    model = build_model(len(tok), tok.eos_token_id, tok.pad_token_id, args.seed)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocab={len(tok)} params={n_params}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, min(50, args.steps // 10))
    # linear warmup, then linear decay to 10% so the final checkpoint is not caught mid-oscillation
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 1.0 - 0.9 * max(0, s - warmup) / max(1, args.steps - warmup))
    )
    data_rng = random.Random(args.seed)
    eval_problems = [sample_problem(random.Random(10_000 + i), args.max_operand, args.ops) for i in range(args.eval_size)]

    start = time.time()
    for step in range(1, args.steps + 1):
        input_ids, attention_mask, labels = make_batch(tok, data_rng, args.batch_size, args.max_operand, args.ops)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == args.steps:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            greedy = evaluate(model, tok, eval_problems, do_sample=False)
            sampled = evaluate(model, tok, eval_problems, do_sample=True)
            print(f"  eval step {step}: greedy {greedy:.3f} sampled@T=1 {sampled:.3f}", flush=True)

    sft_greedy = evaluate(model, tok, eval_problems, do_sample=False)
    sft_sampled = evaluate(model, tok, eval_problems, do_sample=True)
    print(f"after SFT: greedy {sft_greedy:.3f} sampled@T=1 {sft_sampled:.3f}")
    # Bake a sampling temperature into the weights: with tied embeddings, logits are linear in the final RMSNorm
    # weight, so dividing it by T makes sampling at temperature 1.0 equal to sampling the SFT model at temperature T.
    # Greedy decoding is unchanged (mostly right), sampling is diffuse (partly right): GRPO gets mixed-reward groups
    # and a consistent "sharpen" signal, so the reward rises within a few hundred CPU steps.
    with torch.no_grad():
        model.model.norm.weight.div_(args.bake_temperature)
    greedy = evaluate(model, tok, eval_problems, do_sample=False)
    sampled = evaluate(model, tok, eval_problems, do_sample=True)
    print(f"final: greedy {greedy:.3f} sampled@T=1 {sampled:.3f} ({time.time() - start:.0f}s)")

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    with open(args.out / "build_info.json", "w") as f:
        info = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("out", "threads")}
        info.update(sft_greedy_accuracy=round(sft_greedy, 4), sft_sampled_accuracy=round(sft_sampled, 4))
        info.update(greedy_accuracy=round(greedy, 4), sampled_accuracy=round(sampled, 4))
        json.dump(info, f, indent=2)
        f.write("\n")
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
