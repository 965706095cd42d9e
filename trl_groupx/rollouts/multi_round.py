"""MOTIF's multi-round thinking as a TRL 1.16 `rollout_func` (catalog id `motif`).

Paper: "MOTIF: Modular Thinking via Reinforcement Fine-tuning in LLMs", arXiv:2507.02851.
Official code: purbeshmitra/MOTIF@4838e9ea876c9a135d9b2737eb05b9c86c362b18:motif.py
(`model_iteration` l.172-190: the later rounds; `total_reward_func` l.196-215: the outcome reward;
`SYSTEM_PROMPT` l.37-53; trainer set-up l.131-165).

What one rollout row is (paper and code agree: README "applying the reward at the first round of inference
outcomes"; in the code the GRPO completion is the first round and the later rounds run under `torch.no_grad()`
inside the reward function):

1. Round 1: the policy answers the dataset prompt. These tokens are the row's `completion_ids`, the only tokens
   trained; every one of them is a model token (no `env_mask` is needed).
2. Rounds 2..k, `num_futures` times per row (official: 4 trajectories, 3 rounds): round r's prompt is the row's
   prompt with its last user message replaced by `template` filled with the question, the index r-1 of the round
   just finished and the carried text of that round (`carry="answer"`: the text inside the last `<answer>` tag,
   official `extract_xml_answer`); the last round's prompt also gets `final_note`. Only the latest carried text
   enters the prompt (official l.179: `augmented_prompt = prompt + ...` restarts from the question each round), so
   every round fits the context limit on its own.
3. The final-round texts of the futures travel with the row as the extra field `multi_round_final`
   (`list[str]`, `num_futures` entries; for `num_rounds=1` the round-1 text itself), and the round prompts of each
   future as `multi_round_prompts` (`list[list[str]]`, the user message of rounds 2..k). Reward functions read
   them (TRL merges rollout_func extra fields into the reward inputs): `trl_groupx.rewards.motif_outcome_reward`
   is the official 2/1/0 score averaged over the futures, computed once per row, so the round-1 completion is
   trained on the expected outcome of the rounds it starts.

Choices (where the paper leaves it open or the code differs from the paper):
- `future_model="policy"` (default): the later rounds are sampled from the current policy, as the paper's
  description and the official evaluation (l.257, every round with the trained adapter) have it. The official
  training code samples them with `lora_request=None`, i.e. the frozen base model (`official-code.md`, surprise 2);
  `future_model="base"` reproduces that (the LoRA adapter disabled; full fine-tuning has no base copy: refused).
- Round 1 is sampled with the trainer's own `temperature` / `top_p` / `top_k` / `max_completion_length` (TRL's
  generation in the official code); the later rounds with `future_temperature=0.8`, `future_top_p=0.95`
  (official `model_iteration` defaults) and `max_round_tokens` new tokens (official 2048; `None` = the trainer's
  `max_completion_length`).
- Each row uses its own question (official: `prompts[0][-1]['content']`, the first prompt of the batch for every
  row, which is only right for one prompt per batch) and keeps the row's other messages (system prompt) for
  every round (official: the fixed `SYSTEM_PROMPT`).
- `final_note` names the final round by its ordinal (`"third"` at k=3, the official text).
- Later rounds are not trained. Laying the rounds end to end in one completion with the carried text marked
  `env_mask=0` would train round r under a context (the whole earlier transcript) that it was not sampled from,
  since a MOTIF round sees only the question and the carried text; TRL gives a rollout_func one row per prompt,
  so training every round faithfully would need one row per round (a trainer change).
- Generation is transformers `generate()` on the trainer's model, in eval mode (no dropout while sampling);
  vLLM is refused (the rollout does not use the vLLM engine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "CARRIES",
    "MOTIF_FINAL_NOTE",
    "MOTIF_ROUND_TEMPLATE",
    "extract_answer",
    "make_multi_round_rollout",
    "round_messages",
]

#: Official l.179: `prompt + f" Progress in round {iter}: \"" + ans + "\""`.
MOTIF_ROUND_TEMPLATE = '{question} Progress in round {round}: "{carry}"'
#: Official l.182 with the ordinal filled in ("third" at three rounds).
MOTIF_FINAL_NOTE = " Current round is the final ({ordinal}) round. Provide a final answer."

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def extract_answer(text: str) -> str:
    """The text inside the last `<answer>` tag (to `</answer>` or the end), stripped; the whole text stripped
    when there is no tag (official `extract_xml_answer`, l.85-88)."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


#: What a round hands to the next one: `"answer"` (official) or `"full"` (the whole round output, stripped).
CARRIES: dict[str, Callable[[str], str]] = {"answer": extract_answer, "full": str.strip}


def _ordinal(n: int) -> str:
    return _ORDINALS[n - 1] if n <= len(_ORDINALS) else f"{n}th"


def _question_and_rest(prompt: Any) -> tuple[str, list[dict] | None]:
    """The question (last user message, or the plain prompt) and the messages before it (`None` for text)."""
    if isinstance(prompt, str):
        return prompt, None
    users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
    if not users:
        raise ValueError("multi_round rollout: a conversational prompt needs a user message (the question).")
    i = users[-1]
    if not isinstance(prompt[i]["content"], str):
        raise ValueError("multi_round rollout: the question must be text (typed content blocks are not supported).")
    return prompt[i]["content"], [dict(m) for m in prompt[:i]]


def round_messages(prompt: Any, carried: str, finished_round: int, num_rounds: int,
                   template: str = MOTIF_ROUND_TEMPLATE, final_note: str = MOTIF_FINAL_NOTE) -> Any:
    """The prompt of round `finished_round + 1` (1-based rounds): the row's prompt with its question replaced by
    `template` (fields `{question}`, `{round}` = `finished_round`, `{carry}` = `carried`), plus `final_note`
    (field `{ordinal}`) when that round is the last. Conversational prompts keep the messages before the question
    (a system prompt) and drop any after it; text prompts become the filled template."""
    question, before = _question_and_rest(prompt)
    text = template.format(question=question, round=finished_round, carry=carried)
    if finished_round + 1 == num_rounds:
        text += final_note.format(ordinal=_ordinal(num_rounds))
    return text if before is None else [*before, {"role": "user", "content": text}]


def _check_factory_args(num_rounds: int, carry: Any, template: str, final_note: str, num_futures: int,
                        future_model: str, future_temperature: float, future_top_p: float,
                        max_round_tokens: int | None) -> None:
    if not isinstance(num_rounds, int) or num_rounds < 1:
        raise ValueError(f"num_rounds must be an integer >= 1 (MOTIF: 3), got {num_rounds!r}.")
    if not isinstance(num_futures, int) or num_futures < 1:
        raise ValueError(f"num_futures must be an integer >= 1 (MOTIF: 4 trajectories per row), got {num_futures!r}.")
    if not callable(carry) and carry not in CARRIES:
        raise ValueError(f"carry must be one of {sorted(CARRIES)} or a callable str -> str, got {carry!r}.")
    for field, value in (("{question}", template), ("{carry}", template)):
        if field not in value:
            raise ValueError(f"template must contain {field} (MOTIF: {MOTIF_ROUND_TEMPLATE!r}), got {value!r}.")
    try:
        template.format(question="", round=1, carry="")
        final_note.format(ordinal="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"template may use only {{question}}, {{round}}, {{carry}} and final_note only "
                         f"{{ordinal}} (double other braces): {err!r}.") from None
    if future_model not in ("policy", "base"):
        raise ValueError(f"future_model must be 'policy' (current model) or 'base' (adapter disabled, the official "
                         f"training code), got {future_model!r}.")
    if not future_temperature > 0:
        raise ValueError(f"future_temperature must be > 0 (MOTIF: 0.8), got {future_temperature!r}.")
    if not 0 < future_top_p <= 1:
        raise ValueError(f"future_top_p must be in (0, 1] (MOTIF: 0.95), got {future_top_p!r}.")
    if max_round_tokens is not None and (not isinstance(max_round_tokens, int) or max_round_tokens < 1):
        raise ValueError(f"max_round_tokens must be None (max_completion_length) or an integer >= 1, "
                         f"got {max_round_tokens!r}.")


def _template_ids(tok: Any, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _sample(model: Any, tok: Any, prompts_ids: list[list[int]], *, temperature: float, top_p: float,
            top_k: int | None, max_new_tokens: int) -> list[list[int]]:
    """One sampled continuation per prompt (left-padded batch), cut after the first EOS (kept) and unpadded."""
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts_ids)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts_ids], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_ids], device=device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                             top_p=top_p, top_k=top_k or 0, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=eos)
    completions = []
    for row in out[:, width:].tolist():
        cut = row.index(eos) + 1 if eos in row else len(row)
        completions.append(row[:cut] if eos in row else [t for t in row if t != pad])
    return completions


def make_multi_round_rollout(num_rounds: int = 3, carry: str | Callable[[str], str] = "answer",
                             template: str = MOTIF_ROUND_TEMPLATE, final_note: str = MOTIF_FINAL_NOTE,
                             num_futures: int = 4, future_model: str = "policy", future_temperature: float = 0.8,
                             future_top_p: float = 0.95, max_round_tokens: int | None = None) -> Callable:
    """`rollout_func(prompts, trainer) -> dict` for MOTIF's multi-round thinking (module docstring); defaults are
    the official ones except `future_model` (see there). Bad arguments raise `ValueError` here."""
    _check_factory_args(num_rounds, carry, template, final_note, num_futures, future_model, future_temperature,
                        future_top_p, max_round_tokens)
    carry_fn = carry if callable(carry) else CARRIES[carry]

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        if getattr(trainer, "use_vllm", False) or getattr(trainer.args, "use_vllm", False):
            raise ValueError("rollout='multi_round' generates with transformers on the trainer's model; set "
                             "use_vllm=False.")
        tok = trainer.processing_class
        tok = getattr(tok, "tokenizer", tok)  # a processor's text tokenizer
        model = trainer.accelerator.unwrap_model(trainer.model)
        if future_model == "base" and num_rounds > 1 and not hasattr(model, "disable_adapter"):
            raise ValueError("future_model='base' samples the later rounds from the base model under the disabled "
                             "LoRA adapter: train with a peft_config, or use future_model='policy'.")
        was_training = model.training
        model.eval()
        try:
            prompt_ids = [_template_ids(tok, p) for p in prompts]
            first = _sample(model, tok, prompt_ids, temperature=trainer.temperature, top_p=trainer.top_p,
                            top_k=trainer.top_k, max_new_tokens=trainer.max_completion_length)
            first_text = tok.batch_decode(first, skip_special_tokens=True)
            finals, round_prompts = _later_rounds(model, tok, prompts, first_text, trainer.max_completion_length)
        finally:
            model.train(was_training)
        return {"prompt_ids": prompt_ids, "completion_ids": first, "logprobs": None,
                "multi_round_final": finals, "multi_round_prompts": round_prompts}

    def _later_rounds(model: Any, tok: Any, prompts: list, first_text: list[str],
                      max_completion_length: int) -> tuple[list[list[str]], list[list[list[str]]]]:
        """Rounds 2..k for every (row, future), batched per round; returns the final texts and the round prompts."""
        n = len(prompts)
        if num_rounds == 1:
            return [[t] for t in first_text], [[] for _ in range(n)]
        flat = [(i, j) for i in range(n) for j in range(num_futures)]
        previous = [first_text[i] for i, _ in flat]
        asked: list[list[str]] = [[] for _ in flat]
        for finished in range(1, num_rounds):
            msgs = [round_messages(prompts[i], carry_fn(previous[f]), finished, num_rounds, template, final_note)
                    for f, (i, _) in enumerate(flat)]
            for f, m in enumerate(msgs):
                asked[f].append(m if isinstance(m, str) else m[-1]["content"])
            ids = [_template_ids(tok, m) for m in msgs]
            kwargs = dict(temperature=future_temperature, top_p=future_top_p, top_k=None,
                          max_new_tokens=max_round_tokens or max_completion_length)
            if future_model == "base":
                with model.disable_adapter():
                    out = _sample(model, tok, ids, **kwargs)
            else:
                out = _sample(model, tok, ids, **kwargs)
            previous = tok.batch_decode(out, skip_special_tokens=True)
        finals = [previous[i * num_futures:(i + 1) * num_futures] for i in range(n)]
        prompts_out = [asked[i * num_futures:(i + 1) * num_futures] for i in range(n)]
        return finals, prompts_out

    rollout.num_rounds = num_rounds  # read by tests and logs
    rollout.num_futures = num_futures
    return rollout
