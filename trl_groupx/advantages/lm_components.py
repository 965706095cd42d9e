"""Model-backed components for the advantage variants that take a user component by name: an LM judge for SGPO's
all-negative rescue (`allneg_aifeedback_judge`) and an embedding similarity scorer for DaGRPO (`dagrpo_scorer`).

Both papers use a model where the built-ins (`arithmetic_prefix`, `token_jaccard`) are rule-based toys. Python users
build one from a loaded model (or a path) and register it under a name; a recipe then names it:

    from trl_groupx.advantages.allneg_aifeedback import register_allneg_judge
    from trl_groupx.advantages.dagrpo import register_dagrpo_scorer
    from trl_groupx.advantages.lm_components import EmbeddingSimilarityScorer, LMJudge

    register_allneg_judge("qwen_judge", LMJudge.from_pretrained("Qwen/Qwen2.5-7B-Instruct"))
    register_dagrpo_scorer("qwen_embed", EmbeddingSimilarityScorer.from_pretrained("Qwen/Qwen2.5-0.5B"))
    GRPOConfig(advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="qwen_judge", ...)

A recipe that cannot run Python names a model instead, `allneg_aifeedback_judge: "lm_judge:<model path or hub id>"`
or `dagrpo_scorer: "embedding:<model path or hub id>"` (`MODEL_JUDGE_PREFIX`, `MODEL_SCORER_PREFIX`): the component
is built with its defaults from that path on first use, once per process, on the process's own GPU. Loading a model
runs no code from it (`trust_remote_code` stays off).
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._group_judges import NamedJudges

#: The default judge question. `{prompt}` and `{completion}` are required; any other `{name}` is filled from the
#: dataset column `name` of the row.
DEFAULT_JUDGE_TEMPLATE = (
    "Problem:\n{prompt}\n\nResponse:\n{completion}\n\n"
    "The response's final answer may be wrong. Are its reasoning steps correct as far as they go? "
    "Answer Yes or No."
)
MODEL_JUDGE_PREFIX = "lm_judge:"
MODEL_SCORER_PREFIX = "embedding:"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def default_device() -> torch.device:
    """This process's GPU (`LOCAL_RANK` under torchrun/accelerate) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def message_text(value: Any) -> str:
    """Plain text of a prompt or completion as TRL passes them: a string as is; a conversational list of messages as
    the contents of its non-system messages joined by blank lines (a system prompt says nothing about the task)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return str(value.get("content") or "")
    if isinstance(value, list | tuple):
        return "\n\n".join(message_text(m) for m in value
                           if not (isinstance(m, dict) and m.get("role") == "system"))
    return str(value)


def single_token_id(tokenizer: Any, token: str | int, argument: str) -> int:
    """The one vocabulary id of `token` (a string that encodes to exactly one id, or an id); `ValueError` naming
    `argument` otherwise."""
    if isinstance(token, int) and not isinstance(token, bool):
        ids = [token] if 0 <= token < len(tokenizer) else []
    elif isinstance(token, str) and token:
        ids = tokenizer.encode(token, add_special_tokens=False)
    else:
        raise ValueError(f"{argument} must be a non-empty string or a token id, got {token!r}.")
    unk = getattr(tokenizer, "unk_token_id", None)
    if len(ids) != 1 or (unk is not None and ids[0] == unk):
        raise ValueError(f"{argument}={token!r} is not one token of the judge's tokenizer (it encodes to {ids}); pass a "
                         f"string the tokenizer keeps whole (e.g. 'Yes' or ' Yes' for BPE vocabularies) or its id.")
    return ids[0]


def _accepts(model: Any, argument: str) -> bool:
    try:
        return argument in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def _padded(rows: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`(B, L)` ids and attention mask of `rows`, padded on the left or the right with `pad_id`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


def _pad_id(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None) if tokenizer is not None else None
        if isinstance(value, int):
            return value
    return 0  # never read: padded positions are masked out of attention and of every read


class _EvalMode:
    """No grad and `model.eval()` for the duration (dropout off), restoring the model's mode afterwards."""

    def __init__(self, model: Any) -> None:
        self.model, self.was_training = model, bool(getattr(model, "training", False))
        self.no_grad = torch.no_grad()

    def __enter__(self) -> None:
        self.no_grad.__enter__()
        self.model.eval()

    def __exit__(self, *exc: Any) -> None:
        self.model.train(self.was_training)
        self.no_grad.__exit__(*exc)


def _load(path: str, auto_cls: str, dtype: Any, device: torch.device | str | None) -> tuple[Any, Any]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = getattr(transformers, auto_cls).from_pretrained(path, dtype=dtype)
    return model.to(default_device() if device is None else device).eval(), tokenizer


class LMJudge:
    r"""SGPO judge backed by a causal LM: each (prompt, completion) is scored by the judge's next-token probability of
    a "yes" token against a "no" token after a question built from `template`.

    `score = P(yes) / (P(yes) + P(no)) = σ(z_yes − z_no)`, with `z` the judge's next-token logits after the filled
    template (wrapped as one user turn of the tokenizer's chat template, with the generation prompt, when
    `use_chat_template`), computed in float32. The renormalisation over the two tokens makes the score a probability
    in `[0, 1]` whatever mass the judge puts on other tokens.

    The score scale is what `allneg_aifeedback` expects of a judge: one score in `[0, 1]` per completion, which
    replaces the reward of that wrong response before GRPO's normalisation (`r̃_i = j_i`). Choice: P(yes) of a
    yes/no question stands in for the paper's step judge, whose judged-reward formula (the paper's method section)
    was not readable here, only its abstract ("a step-wise judge model" for "all-negative-sample groups"); the
    default question (`DEFAULT_JUDGE_TEMPLATE`) asks whether the response's steps are right as far as they go, so
    a wrong response with a longer correct part scores higher, as the rule-based `arithmetic_prefix` toy does.

    Rendering: a conversational prompt or completion enters the template as the contents of its non-system messages
    joined by blank lines (`message_text`). `template` must contain `{prompt}` and `{completion}`; any other
    `{name}` is filled from the dataset column `name` (e.g. a reference answer, `{answer}`); values are substituted
    in one pass, so braces inside them are left alone.

    Computation: batches of `batch_size` rows, left-padded with explicit position ids (so padding changes no
    score), under `torch.no_grad()` with the model in eval mode (its mode is restored afterwards), on the judge
    model's device; only the last position's logits are computed when the model accepts `logits_to_keep`.

    Args:
        model: a causal LM (`AutoModelForCausalLM`), on the device it should run on.
        tokenizer: its tokenizer.
        template (`str`): the question, with `{prompt}` and `{completion}` (default `DEFAULT_JUDGE_TEMPLATE`).
        yes_token, no_token (`str | int`): the answer tokens; each must be one token of `tokenizer` (a string that
            encodes to exactly one id without special tokens, or an id). BPE vocabularies often need the leading
            space (`" Yes"`) when the template ends without a chat template's assistant prefix.
        use_chat_template (`bool | None`): wrap the question as a user turn; `None`: when the tokenizer has one.
        batch_size (`int`): rows per forward.

    Raises:
        ValueError: naming `template`, `yes_token`, `no_token` or `batch_size` for a bad value; at call time, naming
            a template placeholder that is not a dataset column.
    """

    def __init__(self, model: Any, tokenizer: Any, *, template: str = DEFAULT_JUDGE_TEMPLATE,
                 yes_token: str | int = "Yes", no_token: str | int = "No", use_chat_template: bool | None = None,
                 batch_size: int = 8) -> None:
        if not isinstance(template, str):
            raise ValueError(f"template must be a string with {{prompt}} and {{completion}}, got {template!r}.")
        missing = [p for p in ("prompt", "completion") if "{" + p + "}" not in template]
        if missing:
            raise ValueError(f"template lacks the placeholder(s) {', '.join('{' + p + '}' for p in missing)}: it "
                             "must contain {prompt} and {completion}, where the judged prompt and response go.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        self.yes_id = single_token_id(tokenizer, yes_token, "yes_token")
        self.no_id = single_token_id(tokenizer, no_token, "no_token")
        if self.yes_id == self.no_id:
            raise ValueError(f"yes_token={yes_token!r} and no_token={no_token!r} are the same token ({self.yes_id}); "
                             "the score compares two different answers.")
        self.model, self.tokenizer, self.template, self.batch_size = model, tokenizer, template, batch_size
        self.columns = [p for p in _PLACEHOLDER.findall(template) if p not in ("prompt", "completion")]
        self.use_chat_template = (bool(getattr(tokenizer, "chat_template", None)) if use_chat_template is None
                                  else use_chat_template)
        self.__name__ = f"LMJudge({getattr(getattr(model, 'config', None), '_name_or_path', type(model).__name__)})"

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: Any = "auto", device: torch.device | str | None = None,
                        **kwargs: Any) -> LMJudge:
        """Load `AutoModelForCausalLM` and `AutoTokenizer` from `path` (a folder or hub id; `dtype` as transformers
        takes it) onto `device` (default: this process's GPU, `default_device()`); `kwargs` go to the constructor."""
        model, tokenizer = _load(path, "AutoModelForCausalLM", dtype, device)
        return cls(model, tokenizer, **kwargs)

    def questions(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[str]:
        """The filled template of every row (before the chat template)."""
        absent = [c for c in self.columns if c not in columns]
        if absent:
            raise ValueError(f"template placeholder(s) {', '.join('{' + c + '}' for c in absent)} name no dataset "
                             f"column (columns: {sorted(k for k in columns if k != 'trainer_state')}).")
        rows = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            values = {"prompt": message_text(prompt), "completion": message_text(completion)}
            values.update({c: message_text(columns[c][i]) for c in self.columns})
            rows.append(_PLACEHOLDER.sub(lambda m, v=values: v.get(m.group(1), m.group(0)), self.template))
        return rows

    def _encode(self, question: str) -> list[int]:
        if self.use_chat_template:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                      add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False)  # the chat template has its own
        return self.tokenizer.encode(question, add_special_tokens=True)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        """One score in `[0, 1]` per (prompt, completion); `columns` are the rows' dataset columns. `None` (unscored)
        for a question that encodes to no token (an empty fill of a bare template without a chat template)."""
        encoded = [self._encode(q) for q in self.questions(prompts, completions, **columns)]
        rows = [i for i, ids in enumerate(encoded) if ids]
        device, scores = _model_device(self.model), [None] * len(encoded)
        keep_last = {"logits_to_keep": 1} if _accepts(self.model, "logits_to_keep") else {}
        with _EvalMode(self.model):
            for start in range(0, len(rows), self.batch_size):
                batch = rows[start:start + self.batch_size]
                ids, mask = _padded([encoded[i] for i in batch], _pad_id(self.tokenizer), left=True)
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                    position_ids=positions.to(device), use_cache=False, **keep_last).logits[:, -1]
                pair = logits[:, [self.yes_id, self.no_id]].float()
                for i, score in zip(batch, torch.softmax(pair, dim=-1)[:, 0].cpu().tolist(), strict=True):
                    scores[i] = score
        return scores


class EmbeddingSimilarityScorer:
    r"""DaGRPO scorer backed by a model's hidden states: the cosine similarity of the two completions' mean-pooled
    last hidden states.

    Per completion `i` with tokens `t ∈ T_i`: `e_i = mean_{t ∈ T_i} h_t` (the last hidden state, in float32) and
    `sim_ij = clamp(e_i·e_j / (‖e_i‖ ‖e_j‖), 0, 1)`; one `G × G` matrix per group, the shape and `[0, 1]` range
    `dagrpo_scorer` requires (`pair_similarity_for_batch`).

    Choice: a negative cosine is clipped to 0 rather than mapped by `(1 + cos)/2`, so that the similarity keeps the
    cosine's own scale where DaGRPO's threshold acts (near 1). Choice: the pool covers the completion's own tokens
    only: padding and the special tokens the tokenizer adds (a BOS's hidden state is large and shared by every
    sequence, which would pull all similarities towards 1) are left out, although the model sees the special
    tokens. Choice: identical token sequences get exactly 1 (they are the same response; a batched forward's
    rounding must not move them below a threshold of 1); the diagonal is 1. Choice: a completion with no token
    has no embedding: its pairs are `None` (unscored, never masked).

    Tokens: with `tokenizer`, the decoded completions are re-tokenised with it (any model, e.g. a sentence encoder
    or the judge); with `tokenizer=None`, the policy's own token ids are used as they are (only for a model that
    shares the policy's vocabulary, e.g. a frozen copy of the base model).

    Computation: batches of `batch_size` completions, right-padded (causal models read no padding; encoders mask
    it), under `torch.no_grad()` with the model in eval mode (restored afterwards), on the model's device. The last
    hidden state is `last_hidden_state` (an `AutoModel`) or the last of `hidden_states` (a `*ForCausalLM`, with
    `logits_to_keep=1` when accepted so that no full-vocabulary logits are built).

    Args:
        model: any transformers model (`AutoModel`, `AutoModelForCausalLM`, ...) returning hidden states.
        tokenizer: its tokenizer, or `None` to use the policy's token ids.
        batch_size (`int`): completions per forward.
    """

    def __init__(self, model: Any, tokenizer: Any | None = None, *, batch_size: int = 16) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        # whether the model's output lacks `last_hidden_state` (a `*ForCausalLM`): learnt on the first forward, so that
        # a model that has it never builds every layer's hidden states
        self._from_hidden_states: bool | None = None
        self.__name__ = ("EmbeddingSimilarityScorer("
                         f"{getattr(getattr(model, 'config', None), '_name_or_path', type(model).__name__)})")

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: Any = "auto", device: torch.device | str | None = None,
                        **kwargs: Any) -> EmbeddingSimilarityScorer:
        """Load `AutoModel` and `AutoTokenizer` from `path` (a folder or hub id) onto `device` (default: this
        process's GPU, `default_device()`); `kwargs` go to the constructor."""
        model, tokenizer = _load(path, "AutoModel", dtype, device)
        return cls(model, tokenizer, **kwargs)

    def _tokens(self, completions: Sequence[Any],
                completion_ids: Sequence[Sequence[int]]) -> list[tuple[list[int], list[bool]]]:
        """Per completion: the ids the model reads and which of them are pooled."""
        if self.tokenizer is None:
            return [(list(ids), [True] * len(ids)) for ids in completion_ids]
        texts = [message_text(c) for c in completions]
        enc = self.tokenizer(texts, add_special_tokens=True, return_special_tokens_mask=True)
        return [(list(ids), [not s for s in special])
                for ids, special in zip(enc["input_ids"], enc["special_tokens_mask"], strict=True)]

    def embeddings(self, completions: Sequence[Any], completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """`(G, H)` float32 mean-pooled last hidden states; a row of NaN for a completion with no pooled token."""
        return self._embed(self._tokens(completions, completion_ids))

    def _embed(self, rows: list[tuple[list[int], list[bool]]]) -> torch.Tensor:
        device, pad, out = _model_device(self.model), _pad_id(self.tokenizer), []
        keep_last = {"logits_to_keep": 1} if _accepts(self.model, "logits_to_keep") else {}
        with _EvalMode(self.model):
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start:start + self.batch_size]
                ids, mask = _padded([r[0] or [pad] for r in chunk], pad, left=False)  # an empty row reads one pad
                pool = torch.zeros(ids.shape, dtype=torch.bool)
                for i, (_, pooled) in enumerate(chunk):
                    pool[i, : len(pooled)] = torch.tensor(pooled, dtype=torch.bool)
                hidden = self._last_hidden(ids.to(device), mask.to(device), keep_last).float().cpu()
                weights = pool.float()[:, :, None]
                count = weights.sum(1)
                out.append((hidden * weights).sum(1) / count.where(count > 0, torch.tensor(float("nan"))))
        return torch.cat(out)

    def _last_hidden(self, ids: torch.Tensor, mask: torch.Tensor, keep_last: dict[str, int]) -> torch.Tensor:
        result = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=bool(self._from_hidden_states),
                            **keep_last)
        hidden = getattr(result, "last_hidden_state", None)
        if hidden is not None:
            self._from_hidden_states = False
            return hidden
        if not self._from_hidden_states:
            self._from_hidden_states = True
            return self._last_hidden(ids, mask, keep_last)
        return result.hidden_states[-1]

    def __call__(self, completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                 **kwargs: Any) -> list[list[float | None]]:
        """`sim[i][j]` in `[0, 1]` for the `G` completions of one group; `None` for a pair with an empty one."""
        rows = self._tokens(completions, completion_ids)
        emb = self._embed(rows)
        unit = emb / emb.norm(dim=-1, keepdim=True)
        cosine = (unit @ unit.T).clamp(0.0, 1.0)
        ids = [tuple(r[0]) for r in rows]
        return [[None if math.isnan(cosine[i, j]) else 1.0 if ids[i] == ids[j] else float(cosine[i, j])
                 for j in range(len(ids))] for i in range(len(ids))]


class ModelNamedJudges(NamedJudges):
    """A `NamedJudges` whose names may also be `<prefix><model path>`: the component `build(path)` is built on first
    use and kept, so a recipe can name a model without any Python (checking the name loads nothing)."""

    def __init__(self, flag: str, register_call: str, prefix: str, build: Callable[[str], Callable[..., Any]]) -> None:
        super().__init__(flag, register_call)
        self.prefix, self.build = prefix, build

    def check(self, name: Any) -> None:
        if isinstance(name, str) and name.startswith(self.prefix):
            if not name[len(self.prefix):].strip():
                raise ValueError(f"{self.flag}={name!r} names no model: write {self.prefix}<model folder or hub id>.")
            return
        try:
            super().check(name)
        except ValueError as error:
            raise ValueError(f"{error} Or name a model: {self.prefix}<model folder or hub id>.") from None

    def get(self, name: Any) -> Callable[..., Any]:
        if isinstance(name, str) and name.startswith(self.prefix) and name not in self._judges:
            self.check(name)
            self._judges[name] = self.build(name[len(self.prefix):].strip())
        return super().get(name)
