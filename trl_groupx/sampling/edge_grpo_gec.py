"""EDGE-GRPO's Guided Error Correction (GEC), the generation-output rewrite behind `edge_grpo_gec=True`.

GEC belongs to the `edge_grpo` catalog id (arXiv:2507.21848; its Entropy-Driven Advantage is
`token_weighting="edge_grpo"`, `trl_groupx/token_weights/edge_grpo.py`): after TRL generates and scores a training
batch, every response the run's rewards do not score as fully correct is corrected (continued by the policy after a
reflection cue, or completed with the prompt's reference answer or solution), re-scored, and trained on as if
sampled. The full method is `edge_grpo_gec=True` with
`token_weighting="edge_grpo"`.

Official code: `ZhangXJ199/EDGE-GRPO@cbe13ca8e21af39f7b4c791bc6226348267dbfb2`,
`trl_edge/trainer/grpo_aha_trainer.py:GRPOAhaTrainer._generate_and_score_completions` l.974-1061 (script
`train_grpo.sh`: `--force_reflection True --GEC True`, rewards `box_format_reward + box_accuracy_reward`, so a
fully correct response scores 2). What it does, per response `i` of the local batch:

- selected: `r_i != 2` (`r` = the weighted reward sum with NaN summed as 0, l.978-981), only when the batch's
  (left-padded) prompt width is `< 256` tokens (l.982; one prompt per process in the official script). Every such
  response is selected, in all groups (mixed, all-fail), not only all-fail groups.
- branch, drawn independently per selected response (`random.choice` twice, l.991 and l.998):
  - 1/2 **reflect**: `o_i + " Wait! Something is wrong here."` and the policy continues from
    `prompt + that` for at most 256 new tokens (l.989-995, l.1016-1033);
  - 1/4 **answer**: `o_i + "\\nWait! Something is wrong here. After verification, the correct answer is
    \\\\boxed{" + answer + "}."` (dataset column `answer`, l.997-1000);
  - 1/4 **solution**: the response is replaced by the dataset's `solution` text (l.1001-1002).
- every response is scored again by the reward functions (l.1060), and the loss treats the corrected responses as
  on-policy samples: old log-probs are recomputed from the new sequences (l.1071-1074), `beta = 0`.

Ours (`edge_grpo_gec_*` fields, `trl_groupx/sampling/config.py`):

- selected: scored rows with `r_i < edge_grpo_gec_target_reward` (default 2.0). Choice: `<` instead of `!=` (the
  same rows when 2 is the reward's maximum, and no row above a run's maximum is "corrected"); Choice: an unscored row
  (NaN, every reward function returned None) is left as it is (the framework's NaN = no verdict; the official
  `nansum` turns it into 0 and corrects it).
- prompt condition per row: the row's own prompt token count `< edge_grpo_gec_max_prompt_tokens` (256). Choice:
  per row, not the padded batch width (identical with the official one prompt per process).
- branches: the shares `edge_grpo_gec_answer_share` (0.25) and `edge_grpo_gec_solution_share` (0.25); the rest
  is the reflect branch. The draws are one uniform per global row from a generator seeded with
  `(seed, global_step)`, so every process agrees (Choice: reproducible instead of Python's global `random`).
- reflect branch: the policy continues `prompt + o_i + cue` (`edge_grpo_gec_reflect_cue`, default the official
  text) for at most `edge_grpo_gec_reflect_max_new_tokens` (256) new tokens through TRL's own generator at the run's
  sampling settings, in one generate call per process of equal size on every process (filler rows where a process
  has fewer), and the corrected response is `o_i + cue + continuation`. Choice: token ids, not text: the sampled
  tokens of `o_i` (trailing EOS dropped), then the cue's tokens, then the generated ones (the official code decodes
  and re-tokenizes the text); `o_i` (then the cue) is cut from the end to leave room for one generated token, and
  the result is cut at `max_completion_length` (no EOS then: `mask_truncated_completions` applies).
- token ids: the answer branch keeps the sampled tokens of `o_i` (its trailing EOS removed) and appends
  `tokenize(template(answer)) + EOS` (`edge_grpo_gec_answer_template`, default the official text); the solution
  branch is `tokenize(solution) + EOS`. Choice: the sampled tokens are kept instead of re-tokenizing the decoded
  text (the official round trip through text may re-split them). Choice: a corrected response is at most
  `max_completion_length` tokens (the official re-tokenized sequence is not cut); the answer branch drops sampled
  tokens from the end of `o_i` to make room for the suffix and EOS (a response that ran out of tokens keeps its
  correction), the solution branch is cut at the end (no EOS then: `mask_truncated_completions` applies).
- re-scoring: only the corrected rows are scored again (Choice: the official code re-scores the whole batch, which
  gives the uncorrected rows the same rewards for deterministic reward functions, at twice the reward calls); the
  advantages are then recomputed from the updated rewards (TRL's formula or the run's advantage variant), and EDA
  (`token_weighting="edge_grpo"`) rescales them with the corrected rows' entropies.
- EOS: the official corrected text ends in its first pad token (Qwen's pad = EOS); ours appends the EOS.
- log-probs, vLLM importance ratio and cross-process consistency: GCPO's machinery
  (`reference_injection.py`): old/sampling log-probs of the corrected rows from the current model (ratio 1 at the
  first update), reference log-probs recomputed, every process joins one re-scoring call of equal size.

Shapes: global rewards `(N,)` (N = rows of the generation batch over all processes), per-row prompt token counts
`(N,)`; the rewrite changes the local `(B, T)` completion tensors, widening `T` to the longest corrected response.

Scope: training batches only (evaluation is never corrected); single-turn generation (no rollout_func, tools,
environment_factory); transformers generation (vLLM is refused at config construction: untested); the dataset must
hold both columns.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .baseline_rollouts import continue_prefixes

FLAG = "edge_grpo_gec"
REFLECT, ANSWER, SOLUTION = 0, 1, 2
REFLECT_CUE = " Wait! Something is wrong here."
ANSWER_TEMPLATE = "\nWait! Something is wrong here. After verification, the correct answer is \\boxed{{answer}}."
# Fields refused without the flag, at their defaults
_OWN_FIELDS = {"edge_grpo_gec_answer_template": ANSWER_TEMPLATE, "edge_grpo_gec_answer_column": "answer",
               "edge_grpo_gec_solution_column": "solution", "edge_grpo_gec_answer_share": 0.25,
               "edge_grpo_gec_solution_share": 0.25, "edge_grpo_gec_target_reward": 2.0,
               "edge_grpo_gec_max_prompt_tokens": 256, "edge_grpo_gec_reflect_cue": REFLECT_CUE,
               "edge_grpo_gec_reflect_max_new_tokens": 256}


def validate(config: Any) -> None:
    """Config-time checks of `edge_grpo_gec` and its fields."""
    if not getattr(config, FLAG, False):
        changed = [n for n, d in _OWN_FIELDS.items() if getattr(config, n, d) != d]
        if changed:
            raise ValueError(f"{changed[0]}={getattr(config, changed[0])!r} only applies with {FLAG}=True; set "
                             f"{FLAG}=True or leave {changed[0]} at its default.")
        return
    for name in ("edge_grpo_gec_answer_column", "edge_grpo_gec_solution_column"):
        value = getattr(config, name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}={value!r}: name the dataset column (official dataset: "
                             f"{'answer' if 'answer' in name else 'solution'}).")
    template = config.edge_grpo_gec_answer_template
    if not isinstance(template, str) or "{answer}" not in template:
        raise ValueError(f"edge_grpo_gec_answer_template={template!r} must contain '{{answer}}', where the reference "
                         "answer goes (default: the official 'Wait! Something is wrong here. ... \\boxed{answer}.').")
    shares = [config.edge_grpo_gec_answer_share, config.edge_grpo_gec_solution_share]
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1 for s in shares) or sum(
            shares) > 1:
        raise ValueError(f"edge_grpo_gec_answer_share and edge_grpo_gec_solution_share must lie in [0, 1] with a sum "
                         f"<= 1 (the rest is the reflect branch; official 0.25 and 0.25), got {shares!r}.")
    target = config.edge_grpo_gec_target_reward
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise ValueError(f"edge_grpo_gec_target_reward={target!r}: use a finite number, the reward of a fully correct "
                         "response (official 2.0 = format + accuracy; 1.0 for a single 0/1 accuracy reward).")
    limit = config.edge_grpo_gec_max_prompt_tokens
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"edge_grpo_gec_max_prompt_tokens={limit!r}: use an integer >= 1 (official 256).")
    cue = config.edge_grpo_gec_reflect_cue
    if not isinstance(cue, str) or not cue.strip():
        raise ValueError(f"edge_grpo_gec_reflect_cue={cue!r}: use the non-empty text the policy continues after "
                         f"(official {REFLECT_CUE!r}).")
    budget = config.edge_grpo_gec_reflect_max_new_tokens
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"edge_grpo_gec_reflect_max_new_tokens={budget!r}: use an integer >= 1 (official 256).")
    if getattr(config, "use_vllm", False):
        raise ValueError(f"{FLAG}=True is tested with transformers generation only; set use_vllm=False or "
                         f"{FLAG}=False.")

def rows_to_correct(rewards: torch.Tensor, prompt_lengths: torch.Tensor, target: float,
                    max_prompt_tokens: int) -> torch.Tensor:
    """`(N,)` bool: scored rows below the target reward whose prompt is shorter than `max_prompt_tokens`."""
    if torch.isinf(rewards).any():
        raise ValueError(f"{FLAG}=True got ±inf rewards; reward functions must return finite values or NaN.")
    return ~torch.isnan(rewards) & (rewards < target) & (prompt_lengths.to(rewards.device) < max_prompt_tokens)


def assign_branches(uniforms: torch.Tensor, answer_share: float, solution_share: float) -> torch.Tensor:
    """`(N,)` branch per row from one uniform draw each: `[0, a)` answer, `[a, a+s)` solution, the rest reflect."""
    branch = torch.full_like(uniforms, REFLECT, dtype=torch.long)
    branch[uniforms < answer_share + solution_share] = SOLUTION
    branch[uniforms < answer_share] = ANSWER
    return branch


def branch_uniforms(n: int, seed: int, step: int) -> torch.Tensor:
    """`(n,)` uniforms of one generation batch, the same on every process."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step))
    return torch.rand(n, generator=generator)


def answer_suffix(answer: Any, template: str = ANSWER_TEMPLATE) -> str:
    """The answer-branch text appended to the wrong response (default: the official text)."""
    return template.replace("{answer}", str(answer))


def corrected_ids(branch: int, completion: list[int], reference: str, tokenizer: Any, eos_ids: list[int],
                  max_length: int, template: str = ANSWER_TEMPLATE) -> list[int]:
    """Token ids of a corrected response, at most `max_length`: answer = sampled tokens (trailing EOS dropped, then
    cut from the end to leave room) + suffix + EOS; solution = the reference text + EOS, cut."""
    eos = tokenizer.eos_token_id
    if branch == ANSWER:
        kept = _without_trailing_eos(completion, eos_ids)
        tail = list(tokenizer(answer_suffix(reference, template), add_special_tokens=False)["input_ids"]) + [eos]
        return (kept[: max(max_length - len(tail), 0)] + tail)[:max_length]
    if branch == SOLUTION:
        return (list(tokenizer(reference, add_special_tokens=False)["input_ids"]) + [eos])[:max_length]
    raise ValueError(f"branch {branch} is not corrected here (the reflect branch uses reflect_prefix)")


def _without_trailing_eos(completion: list[int], eos_ids: list[int]) -> list[int]:
    kept = list(completion)
    while kept and kept[-1] in eos_ids:
        kept.pop()
    return kept


def reflect_prefix(completion: list[int], cue_ids: list[int], eos_ids: list[int], max_length: int) -> list[int]:
    """The reflect branch's start, which the policy continues: the sampled tokens (trailing EOS dropped, cut from the
    end to leave room for the cue and one generated token within `max_length`) + the cue's tokens (cut too when the
    cue alone leaves no room: what lies beyond `max_length` would be cut from the corrected response anyway)."""
    kept = _without_trailing_eos(completion, eos_ids)
    return (kept[: max(max_length - len(cue_ids) - 1, 0)] + list(cue_ids))[: max(max_length - 1, 0)]


def reflect_continuations(trainer: Any, output: dict[str, Any], rows: list[int], prefixes: list[list[int]]
                          ) -> list[list[int]]:
    """The policy's continuation of each `prompt + prefix` of this process's `rows`, at most
    `edge_grpo_gec_reflect_max_new_tokens` new tokens (`baseline_rollouts.continue_prefixes`)."""
    budget = min(trainer.args.edge_grpo_gec_reflect_max_new_tokens, trainer.max_completion_length)
    return continue_prefixes(trainer, output, rows, prefixes, budget)


# ---- trainer glue (called by GRPOTrainer._generate_and_score_completions) ----------------------------------------


def check_gec(trainer: Any) -> None:
    """Construction-time refusals: multi-turn generation and missing dataset columns, named with the fix."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "tools", None) or getattr(
            trainer, "environment_factories", None):
        raise ValueError(f"{FLAG}=True rewrites single-turn responses; train without a rollout_func, tools or an "
                         f"environment_factory, or set {FLAG}=False.")
    columns = getattr(trainer.train_dataset, "column_names", None)
    for name in ("edge_grpo_gec_answer_column", "edge_grpo_gec_solution_column"):
        column = getattr(trainer.args, name)
        if columns is not None and column not in columns:
            raise ValueError(f"{FLAG}=True reads {name}={column!r}, which train_dataset lacks (columns: "
                             f"{list(columns)}); add the column or set {name} to the one that holds it.")


def _reference(row: dict[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{FLAG}=True: a response to correct has no reference in column {column!r} (value "
                         f"{value!r}); fill the column for every row or filter such rows out.")
    return str(value)


def apply_gec(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """GEC on one training generation batch: returns the rewritten local `output` and updates
    `trainer._rewards_per_func` (global, identical on every process) with the corrected rows' rewards."""
    from .dapo_dynamic_sampling import weighted_rewards
    from .reference_injection import _recompute_logps, _rescore, raise_together, replace_completions

    args, accel = trainer.args, trainer.accelerator
    procs, rank = accel.num_processes, accel.process_index
    local_n = output["completion_ids"].size(0)
    rewards_per_func = trainer._rewards_per_func
    rewards = weighted_rewards(rewards_per_func, trainer.reward_weights)
    prompt_lengths = accel.gather(output["prompt_mask"].sum(1))
    selected = rows_to_correct(rewards, prompt_lengths, args.edge_grpo_gec_target_reward,
                               args.edge_grpo_gec_max_prompt_tokens)
    branches = assign_branches(branch_uniforms(rewards.numel(), args.seed, trainer.state.global_step),
                               args.edge_grpo_gec_answer_share, args.edge_grpo_gec_solution_share).to(selected.device)
    global_rows = torch.nonzero(selected).flatten().tolist()
    metrics = trainer._metrics["train"]
    metrics["groupx/gec_selected"].append(float(selected.sum().item()))
    metrics["groupx/gec_reflected"].append(float((selected & (branches == REFLECT)).sum().item()))
    metrics["groupx/gec_corrected"].append(float(len(global_rows)))
    if not global_rows:
        return output
    counts = [sum(1 for r in global_rows if r // local_n == p) for p in range(procs)]
    mine = [r - rank * local_n for r in global_rows if r // local_n == rank]
    tokenizer = trainer._tokenizer
    eos_ids = [*trainer.eos_token_ids, tokenizer.pad_token_id]
    max_length = trainer.max_completion_length
    cue_ids = list(tokenizer(args.edge_grpo_gec_reflect_cue, add_special_tokens=False)["input_ids"])

    def sampled(row: int) -> list[int]:
        return output["completion_ids"][row][output["completion_mask"][row].bool()].tolist()

    reflect_rows = [row for row in mine if int(branches[row + rank * local_n]) == REFLECT]
    prefixes = [reflect_prefix(sampled(row), cue_ids, eos_ids, max_length) for row in reflect_rows]
    continued = dict(zip(reflect_rows, (
        (prefix + continuation)[:max_length]
        for prefix, continuation in zip(prefixes, reflect_continuations(trainer, output, reflect_rows, prefixes)))))
    ids, missing = [], None
    try:
        for row in mine:
            branch = int(branches[row + rank * local_n])
            if branch == REFLECT:
                ids.append(continued[row])
                continue
            column = args.edge_grpo_gec_answer_column if branch == ANSWER else args.edge_grpo_gec_solution_column
            ids.append(corrected_ids(branch, sampled(row), _reference(inputs[row], column), tokenizer, eos_ids,
                                     max_length, args.edge_grpo_gec_answer_template))
    except ValueError as err:
        missing = err
    raise_together(missing, accel, args.edge_grpo_gec_solution_column, f"{FLAG}=True")
    sequence_is = bool(getattr(trainer, "use_vllm", False) and trainer.vllm_importance_sampling_correction
                       and trainer.vllm_importance_sampling_mode.startswith("sequence"))
    output = replace_completions(output, mine, ids, tokenizer.pad_token_id, sequence_is, f"{FLAG}=True")
    if trainer.mask_truncated_completions:  # TRL's rule: a completion without EOS at its end is masked
        for row, seq in zip(mine, ids):
            if seq[-1] not in eos_ids:
                output["completion_mask"][row] = 0
                if "tool_mask" in output:
                    output["tool_mask"][row] = 0
    _recompute_logps(trainer, output, mine)
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    output["num_items_in_batch"] = accel.gather(loss_mask.sum()).sum()
    count = max(counts)
    scored = _rescore(trainer, inputs, mine, ids, count)
    new_rows = torch.tensor([p * count + j for p in range(procs) for j in range(counts[p])], device=scored.device,
                            dtype=torch.long)
    rewards_per_func = rewards_per_func.clone()
    targets = torch.tensor(global_rows, device=rewards_per_func.device, dtype=torch.long)
    rewards_per_func[targets] = scored.index_select(0, new_rows).to(rewards_per_func)
    trainer._rewards_per_func = rewards_per_func
    return output
