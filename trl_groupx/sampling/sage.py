"""SAGE (Self-hint Aligned GRPO with privileged supervision): unsolved groups re-rolled under the policy's own hints.

The re-roll runs in the trainer (`self_hints.reroll_with_hints`, called from
`GRPOTrainer._generate_and_score_completions` after TRL has generated and scored the batch): groups in which no
rollout succeeded get a hint, written greedily by the policy from the prompt and its reference solution, and are
generated again from `prompt ⊕ hint`, escalating through three hint levels while they stay unsolved. This module
registers the variant, validates its flags, holds the pure parts (hint request, hint parsing, the hinted prompt,
the solved-group test) and is the stage's filter, which keeps every rollout.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import get_variant, register
from .prompt_rewrite import append_to_prompt

VARIANT_ID = "sage"
_OFFICIAL = "BaohaoLiao/SAGE@8722c1a3aa5bfe5578df8aaf302741a9715a56a2:recipe/hint/hint_trainer.py"

#: The hint levels the policy writes in one JSON object, in escalation order (official `level_1..level_3`).
HINT_LEVELS: tuple[str, ...] = ("level_1", "level_2", "level_3")
#: System text of the hint request (our wording of the official tutoring instruction, recipe/hint/prompt.py:1-23:
#: three progressively more detailed hints that never reveal the answer, returned as a JSON object).
SAGE_HINT_INSTRUCTION = (
    "You write hints that help a student solve a hard problem without giving the solution away. You are shown the "
    "problem and a worked solution. Write three hints, each more detailed than the last: level 1 names the key idea "
    "or approach, level 2 gives more direction on the method or the intermediate steps, level 3 guides closely but "
    "leaves the student to finish. Never state the final answer. Reply with one JSON object only:\n"
    '{"level_1": "...", "level_2": "...", "level_3": "..."}'
)
#: The hint request's user text; `{question}` and `{solution}` are replaced (official layout, prompt.py:25-30).
SAGE_HINT_REQUEST_TEMPLATE = "Question:\n{question}\n\nSolution:\n{solution}\n"
#: Appended to the prompt the hinted rollouts are generated from; `{hint}` is replaced (official wording,
#: hint_trainer.py:_build_answer_messages_with_hint, lines 267-274).
SAGE_HINT_TEMPLATE = "\n\nHere is a hint to help you:\n{hint}"
#: `sage`: unsolved groups re-rolled under hints (official default); `light`: SAGE-light's per-prompt hint levels.
SAGE_METHODS: tuple[str, ...] = ("sage", "light")
#: `variant_state` key of SAGE-light's per-prompt tracker (saved with the Trainer's checkpoints).
LIGHT_STATE_KEY = "sage_light"
#: Extra column of every training row: the prompt as the dataset gave it (reward functions score against it).
ORIGINAL_PROMPT_COLUMN = "sage_prompt"


def _check_template(flag: str, value: Any, fields: tuple[str, ...], default: str) -> None:
    if not isinstance(value, str) or any(f"{{{name}}}" not in value for name in fields):
        wanted = " and ".join(f"'{{{name}}}'" for name in fields)
        raise ValueError(f"{flag}={value!r} must be a string containing {wanted} (default {default!r}).")


def validate(config: Any) -> None:
    """Config-time refusals naming the flag and the fix."""
    column = config.sage_column
    if not isinstance(column, str) or not column:
        raise ValueError(f"sage_column={column!r}: name the dataset column that holds each prompt's reference "
                         "solution, the privileged information hints are written from (e.g. sage_column='solution').")
    instruction = config.sage_hint_instruction
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError(f"sage_hint_instruction={instruction!r}: give the (non-empty) system text that asks the "
                         "policy for the three hint levels as JSON (default: trl_groupx.sampling.sage."
                         "SAGE_HINT_INSTRUCTION).")
    _check_template("sage_hint_request_template", config.sage_hint_request_template, ("question", "solution"),
                    SAGE_HINT_REQUEST_TEMPLATE)
    _check_template("sage_hint_template", config.sage_hint_template, ("hint",), SAGE_HINT_TEMPLATE)
    threshold = config.sage_success_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"sage_success_threshold={threshold!r}: use a finite number; a group counts as solved when "
                         "one of its rollouts scores strictly above it (official: 0).")
    method = config.sage_method
    if method not in SAGE_METHODS:
        raise ValueError(f"sage_method={method!r}: use 'sage' (unsolved groups re-rolled under hints, official "
                         "default) or 'light' (SAGE-light: per-prompt hint levels from the previous visit's accuracy).")
    low, high = config.sage_light_accuracy_min, config.sage_light_accuracy_max
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1 for v in (low, high)) or \
            low > high:
        raise ValueError(f"sage_light_accuracy_min={low!r} and sage_light_accuracy_max={high!r} must lie in [0, 1] "
                         "with min <= max (official 0 and 0.35).")
    if method != "light" and (low, high) != (0.0, 0.35):
        raise ValueError("sage_light_accuracy_min/max only apply with sage_method='light'; set sage_method='light' "
                         "or leave them at their defaults.")
    if getattr(config, "use_vllm", False):
        raise ValueError(f"rollout_filter={VARIANT_ID!r} writes its hints with transformers `generate` through the "
                         "trainer's own generator; it does not run with use_vllm=True yet. Set use_vllm=False.")
    estimator = getattr(config, "advantage_estimator", "grpo")
    if estimator not in (None, "grpo"):
        keyed = {"prompt_keys", "prompt_kl"} & set(get_variant(estimator).requires)
        if keyed:
            raise ValueError(f"advantage_estimator={estimator!r} keeps per-prompt state keyed by the prompt's tokens "
                             f"({sorted(keyed)}), and rollout_filter={VARIANT_ID!r} trains hinted groups under a "
                             "prompt that carries a new hint. Use another advantage_estimator.")


# ---- pure parts ----------------------------------------------------------------------------------------------------


def reference_text(value: Any) -> str | None:
    """A row's reference solution as text, or None when it has none (None, NaN, an empty or blank string): such a
    prompt is never hinted (official: `_extract_question_and_solution` skips it)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = value if isinstance(value, str) else str(value)
    return text.strip() or None


def question_text(prompt: Any) -> str:
    """The question a hint is written for: a text prompt itself, or the text of a conversation's last user
    message (its text blocks joined)."""
    if isinstance(prompt, str):
        return prompt.strip()
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ValueError(f"rollout_filter={VARIANT_ID!r}: a conversational prompt needs a user message (the "
                         "question the hint is written for).")
    content = users[-1]["content"]
    if isinstance(content, str):
        return content.strip()
    return "".join(block.get("text", "") for block in content if block.get("type") == "text").strip()


def hint_request(prompt: Any, solution: str, instruction: str = SAGE_HINT_INSTRUCTION,
                 template: str = SAGE_HINT_REQUEST_TEMPLATE) -> Any:
    """The prompt the policy writes a hint from: `instruction` as system text, then `template` with the question
    and the reference solution. Conversational when `prompt` is (system + user message, as the official
    `_build_hint_messages`), else one text `instruction + "\\n\\n" + request`. Plain substitution, so braces in
    the question or the solution need no escaping."""
    request = template.replace("{question}", question_text(prompt)).replace("{solution}", solution)
    if isinstance(prompt, str):
        return f"{instruction}\n\n{request}"
    return [{"role": "system", "content": instruction}, {"role": "user", "content": request}]


def _json_object(text: str) -> Any:
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, flags=re.DOTALL | re.IGNORECASE)
    candidates = [fenced.group(1)] if fenced else []
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        candidates.append(text[start:end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None


def parse_hint_levels(text: str) -> dict[str, str] | None:
    """The hint levels in the policy's reply: the JSON object inside a ```json fence, else from the first `{` to
    the last `}`; only levels of `HINT_LEVELS` whose value is a non-blank string are kept (stripped). None when
    the reply holds no JSON object or no usable level (the prompt then gets no hint)."""
    payload = _json_object(text)
    if not isinstance(payload, dict):
        return None
    levels = {key: payload[key].strip() for key in HINT_LEVELS
              if isinstance(payload.get(key), str) and payload[key].strip()}
    return levels or None


def hinted_prompt(prompt: Any, hint: str, template: str = SAGE_HINT_TEMPLATE) -> Any:
    """`prompt` followed by `template` with `{hint}` replaced: appended to a text prompt, or to a copy of the last
    user message of a conversation (a content-block list gets a text block); other messages are kept."""
    suffix = template.replace("{hint}", hint)
    return append_to_prompt(prompt, suffix, selector=f"rollout_filter={VARIANT_ID!r}", what="hint")


def solved_groups(rewards: torch.Tensor, group_size: int, threshold: float = 0.0) -> torch.Tensor:
    """`(N/G,)` bool: groups with a rollout whose reward is strictly above `threshold` (official: `reward > 0`); a
    NaN (unscored) rollout never solves its group. ±inf is an error."""
    if torch.isinf(rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return (rewards.view(-1, group_size) > threshold).any(dim=1)  # NaN > t is False


def next_hint_level(level: int, accuracy: float | None, accuracy_min: float, accuracy_max: float) -> int:
    """SAGE-light's hint level `0..3` at a prompt's next visit from its level and accuracy at the last one (official
    `fit` lines 870-895): up one when `accuracy <= accuracy_min`, down one when `accuracy > accuracy_max`, else the
    same; a prompt never seen (`accuracy` None) starts without a hint."""
    if accuracy is None:
        return 0
    if accuracy <= accuracy_min:
        return min(level + 1, len(HINT_LEVELS))
    if accuracy > accuracy_max:
        return max(level - 1, 0)
    return level


def prompt_digest(prompt: Any) -> str:
    """Stable key of a prompt (text or messages) for SAGE-light's tracker: BLAKE2b of its JSON, the same on every
    process, across runs and after a resume (Python's `hash` is salted)."""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def level_targets(solved: torch.Tensor, hints: list[dict[str, str] | None], level: str) -> list[int]:
    """Groups re-rolled at hint `level`: still unsolved and with a non-empty hint at that level (a group whose
    hint lacks the level skips it and may take the next one, as the official loop does)."""
    return [g for g, levels in enumerate(hints) if not bool(solved[g]) and levels is not None and levels.get(level)]


@register(
    VARIANT_ID,
    name="SAGE (Self-hint Aligned GRPO): unsolved groups re-rolled under the policy's own privileged hints",
    paper="Self-Hinting Language Models Enhance Reinforcement Learning (SAGE), arXiv:2602.03143",
    official_code=f"{_OFFICIAL} (RayHintTrainer.fit, 'sage' branch, lines 687-857; _generate_hints_batch, 196-265)",
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, "sage_column": "solution", "sage_success_threshold": 0.0,
           "sage_hint_instruction": SAGE_HINT_INSTRUCTION, "sage_hint_request_template": SAGE_HINT_REQUEST_TEMPLATE,
           "sage_hint_template": SAGE_HINT_TEMPLATE, "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
           "loss_type": "dapo"},
    params=("sage_column", "sage_success_threshold", "sage_hint_instruction", "sage_hint_request_template",
            "sage_hint_template", "sage_method", "sage_light_accuracy_min", "sage_light_accuracy_max"),
    needs=("reference solution column (privileged information the hints are written from)",),
    validate=validate,
)
def sage(batch: RolloutBatch) -> torch.Tensor:
    r"""SAGE's self-hinted re-roll (the catalog's `hint_conditioning="self_hint"`, here `rollout_filter="sage"`,
    `sage_column=<reference column>`; official `trainer.method=sage`).

    For every prompt `x` of a training batch, with reference solution `s` (column `sage_column`) and
    `G = num_generations`:

    1. TRL generates and scores the `G` rollouts `y_i ~ π_θ(·|x)` as usual, `r_i = Σ_f w_f r_f(x, y_i)`.
    2. Groups with no rollout scoring `r_i > τ` (`τ = sage_success_threshold`, official 0; NaN never solves) ask
       the policy itself for hints: one greedy completion `h ~ π_θ(·|q(x, s))` of the hint request
       `q(x, s)` = system `sage_hint_instruction` + user `sage_hint_request_template(question(x), s)`, parsed as a
       JSON object with up to three levels `h_1, h_2, h_3` (increasing detail). Only unsolved groups ask.
    3. For level `ℓ = 1, 2, 3`: every group still unsolved whose hint has level `ℓ` is generated again, all `G`
       rollouts `y'_i ~ π_θ(·|x ⊕ h_ℓ)` (`⊕ = sage_hint_template`), scored with the reward of the *original*
       prompt, `r'_i = Σ_f w_f r_f(x, y'_i)`, and the group's rollouts and rewards are replaced by the re-roll
       (even if it fails again); a group that the re-roll solves stops escalating.
    4. The advantage, token and objective stages then run on the final batch as for GRPO: TRL's (or the chosen)
       group-relative advantage of `r` within each group, log-probs `log π_θ(y|x ⊕ h_ℓ)` for hinted groups and
       `log π_θ(y|x)` otherwise. The hint sits in the prompt, never in the completion: hint tokens get no loss.

    At evaluation (model not training) nothing is hinted (`h = ∅`). The hint request and the hint text are never
    trained.

    Shapes: the global generation batch is `N = P·G` rows; the hint request is one greedy completion per unsolved
    prompt; each level's re-roll regenerates the process's whole local batch (`N / num_processes` rows, hinted rows
    in place) of which only the target groups' rows are kept.

    Source: the paper (arXiv:2602.03143: hints from privileged supervision raise within-group outcome diversity
    under sparse rewards; the reward stays `R(x, τ)`; test time uses no hint) and the official code
    (`BaohaoLiao/SAGE@8722c1a3aa5bfe5578df8aaf302741a9715a56a2`): `recipe/hint/hint_trainer.py`
    `RayHintTrainer.fit`, `"sage"` branch (lines 687-857: rollout, `resolved = any(reward > 0)` per prompt, hints
    for the unresolved ones, levels 1→3 re-rolled and spliced in with `_replace_slices`, lines 763-819),
    `_generate_hints_batch` (lines 196-265: the hint request through the actor with `validate=True`, i.e. verl's
    `val_kwargs`, greedy by default; JSON parsed by `_parse_hint_payload`, lines 162-194),
    `_build_hint_messages` (127-134), `_build_answer_messages_with_hint` (267-274); `recipe/hint/prompt.py` (the
    hint instruction, lines 1-30); `scripts/run_sage.sh` (clip 0.2 / 0.28, no KL and verl's default token-mean
    loss in the flags; n = 8 and lr 1e-6 in `recipes/sage.yaml`).

    Choices (ours, where the official code is bound to verl or leaves it open):

    - Choice: the hint instruction (`SAGE_HINT_INSTRUCTION`) is our wording of the official tutoring prompt (three
      levels, never reveal the answer, JSON with keys `level_1..level_3`); pass the official text through
      `sage_hint_instruction` to match it verbatim. The request layout `"Question:\n{question}\n\nSolution:\n
      {solution}\n"` follows the official template. The question is the text prompt, or the text of the last user
      message (the official code reads a `problem`/`question` column, else decodes the prompt).
    - Choice: for a text (non-conversational) prompt the request is one text, instruction + blank line + request,
      since a text prompt gets no chat template from TRL.
    - Choice: the hinted prompt keeps the dataset's prompt and appends `"\n\nHere is a hint to help you:\n{hint}"`
      to it (to the last user message of a conversation); the official code rebuilds the user message as
      `"Question:\n{question}\n\nHere is a hint to help you:\n{hint}"` under its fixed answer system prompt, which
      for its data differs only by the `"Question:\n"` prefix.
    - Choice: one hint attempt per prompt. The official code retries an unparsable reply up to 3 times, but with
      greedy decoding from unchanged weights our generator returns the same text, so a retry cannot help. A reply
      with no JSON object or no usable level, and a prompt whose reference is None, NaN or blank, get no hint: the
      group keeps its unhinted rollouts (counted in `groupx/sage_hint_failed`, `groupx/sage_no_reference`).
    - Choice: the hint is written with the trainer's own generator at `max_completion_length` new tokens (the
      official uses its response length), greedy (`do_sample=False`, as verl's default `val_kwargs`).
    - Choice: reward functions receive the original prompt `x` as `prompts` (the catalog's `R(x, τ)`) and the
      extra column `sage_prompt` (= `x`) on every row; they are not told the hint. The completions table logs the
      prompt each rollout was generated from (hinted for hinted groups).
    - Choice: each level's re-roll regenerates the local batch with the target rows hinted, as the official
      `run_rollout(gen_batch_to_use)` regenerates the whole batch; TRL's per-call metrics (reward mean, lengths,
      `num_input_tokens_seen`) count every call. A level no process needs is skipped.

    SAGE-light (`sage_method="light"`, official `trainer.method=sage-light`, `fit` lines 858-1065): no re-roll; a
    per-prompt tracker (official `RewardTracker`, keyed by the dataset index) keeps each prompt's hint level
    `ℓ ∈ {0 (none), 1, 2, 3}` and its accuracy `a` at its last visit (share of its `G` rollouts with `r > τ`). At the
    next visit, *before* generation, `ℓ' = min(ℓ + 1, 3)` if `a <= a_min`, `ℓ' = max(ℓ − 1, 0)` if `a > a_max`, else
    `ℓ' = ℓ` (a first visit: `ℓ' = 0`; `a_min = sage_light_accuracy_min`, `a_max = sage_light_accuracy_max`, official
    config 0 and 0.35), `next_hint_level`. Prompts at `ℓ' >= 1` ask the policy for a hint (fresh every visit, the
    prompt's last parsed hint when the reply does not parse, as the official fallback), the whole group is generated
    once from `x ⊕ h_ℓ'`, and the tracker stores the level actually applied (0 when no hint at `ℓ'` was available)
    and the accuracy of this visit. Choice: prompts are keyed by a BLAKE2b digest of the prompt (text or messages,
    JSON), not a dataset index, so the same prompt shares its tracker entry; the tracker is saved with the Trainer's
    checkpoints (`variant_state["sage_light"]`) and is identical on every process (updated from gathered rewards).

    Logged: `groupx/sage_unsolved_groups` (share of groups unsolved after the first rollout),
    `groupx/sage_hinted_level_{1,2,3}` (share of groups trained at each level), `groupx/sage_hint_failed`,
    `groupx/sage_no_reference`.

    Several processes: every process finds the same unsolved groups from the gathered rewards; the process holding
    a group's first row writes its hint (every process makes one greedy call of the same size, padded with repeats),
    the hint texts are gathered, so a group split across processes is re-rolled under one hint; every process joins
    each level's re-roll (one TRL generation call each).

    Scope: transformers generation (`use_vllm=True` is refused at config time); single-turn only (a rollout_func,
    tools or environments are refused at trainer construction, as is a dataset without `sage_column`); text and
    conversational prompts (multimodal outputs are refused by the merge). Advantage variants with per-prompt state
    keyed by the prompt tokens (`prompt_keys`, `prompt_kl`) are refused at config time.

    This function is the stage's filter on the final batch: it keeps every rollout, so the variant composes with
    every advantage estimator (except the per-prompt-state ones), token weighting and objective, but not with
    another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch after the re-rolls.

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
