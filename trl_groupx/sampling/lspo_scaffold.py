"""LSPO's trainer glue behind `rollout_filter="lspo"` (the method and every choice: `lspo.py`).

`check_lspo` refuses at trainer construction what the re-roll cannot reproduce; `scaffold_cliff_groups` runs after
TRL's generation and scoring of a training batch: it fits the throw-away scaffold on the cliff groups' solutions
(`fit_scaffold`), re-rolls their slots with it, splices the successful re-rolls with their truncated behaviour
log-probs, and deletes the scaffold.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.utils import gather_object, is_peft_model

from .._frozen_copy import frozen_policy_copy
from ._scoring import score_aside
from .baseline_rollouts import generate_aside, generating_with_model
from .dapo_dynamic_sampling import weighted_rewards
from .lspo import SCAFFOLD_ADAPTER, VARIANT_ID, cliff_groups, splice_rows, truncated_behaviour_logps
from .reference_injection import _recompute_logps, raise_together, reference_completion_ids, replace_completions

_SELECTOR = f"rollout_filter={VARIANT_ID!r}"


def check_lspo(trainer: Any) -> None:
    """Trainer-construction refusals (what the config cannot see), naming the flag and the fix."""
    if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environments", None) or trainer.tools:
        raise ValueError(f"{_SELECTOR} re-rolls cliff groups with the trainer's own single-turn generator; it cannot "
                         "reproduce a rollout_func, tools or environments. Drop them, or unset rollout_filter.")
    if getattr(trainer, "is_fsdp_enabled", False) or (
            getattr(trainer, "is_deepspeed_enabled", False)
            and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3):
        raise ValueError(f"{_SELECTOR} fits its LoRA scaffold on whole parameters on every process; it does not run "
                         "with FSDP or DeepSpeed ZeRO-3. Use DDP or ZeRO-1/2.")
    column = trainer.args.lspo_column
    columns = getattr(trainer.train_dataset, "column_names", None)
    if columns is not None and column not in columns:
        raise ValueError(f"{_SELECTOR} fits its scaffold on each cliff prompt's ground-truth solution in the dataset "
                         f"column lspo_column={column!r}, which train_dataset lacks (columns: {list(columns)}); add "
                         "the column or set lspo_column to the one that holds the solutions.")


def _solution(row: dict[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
        raise ValueError(f"{_SELECTOR}: a cliff prompt (every rollout failed) has no ground-truth solution in "
                         f"lspo_column={column!r} (value {value!r}); fill the column for every row or filter such "
                         "rows out.")
    return str(value)


@contextlib.contextmanager
def scaffold(trainer: Any) -> Iterator[torch.nn.Module]:
    """The throw-away scaffold, active for generation (`trainer._generate_single_turn`) while the context is open;
    yields the module to fit and to compute log-probs with. Deleted (LoRA) or dropped (full) on exit."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if is_peft_model(model):
        active = model.active_adapter
        model.add_adapter(SCAFFOLD_ADAPTER, copy.deepcopy(model.peft_config[active]))
        params = dict(model.named_parameters())
        with torch.no_grad():  # the scaffold starts as the policy adapter
            for name, param in params.items():
                if f".{active}." in name:
                    params[name.replace(f".{active}.", f".{SCAFFOLD_ADAPTER}.")].copy_(param)
        model.set_adapter(SCAFFOLD_ADAPTER)  # only the scaffold is active and trainable
        try:
            yield model
        finally:
            model.set_adapter(active)
            model.delete_adapter(SCAFFOLD_ADAPTER)
        return
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    frozen = frozen_policy_copy(model)
    # a fused head of the copy's own: the scaffold's log-probs are computed through it, as the policy's are
    add_fused_lm_head(frozen, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
                      outputs=("log_probs", "entropy"))
    config = LoraConfig(r=trainer.args.lspo_lora_r, lora_alpha=trainer.args.lspo_lora_alpha,
                        target_modules="all-linear", lora_dropout=0.0)
    with torch.random.fork_rng(devices=[]):  # the same A on every process, independent of the run's RNG stream
        torch.manual_seed(trainer.args.seed + trainer.state.global_step)
        wrapped = get_peft_model(frozen, config, adapter_name=SCAFFOLD_ADAPTER)
    try:
        with generating_with_model(trainer, wrapped):
            yield wrapped
    finally:
        del wrapped, frozen


def _sft_batch(trainer: Any, prompts: list[Any], targets: list[list[int]], device: Any) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded targets, as TRL lays out a generation batch."""
    prompt_ids, _, _ = trainer._tokenize_prompts(copy.deepcopy(prompts))
    pad = trainer._tokenizer.pad_token_id
    p_width, c_width = max(len(p) for p in prompt_ids), max(len(t) for t in targets)
    ids = torch.full((len(targets), p_width + c_width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    target_mask = torch.zeros((len(targets), c_width))
    for i, (p, t) in enumerate(zip(prompt_ids, targets, strict=True)):
        ids[i, p_width - len(p):p_width] = torch.tensor(p)
        ids[i, p_width:p_width + len(t)] = torch.tensor(t)
        mask[i, p_width - len(p):p_width + len(t)] = 1
        target_mask[i, :len(t)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "target_mask": target_mask.to(device)}


def fit_scaffold(trainer: Any, model: torch.nn.Module, prompts: list[Any], targets: list[list[int]]) -> list[float]:
    """`lspo_sft_steps` AdamW steps of token-mean NLL (temperature 1) of `targets` given `prompts` on the scaffold's
    trainable parameters; the same data on every process. Returns each step's loss."""
    args = trainer.args
    params = [p for n, p in model.named_parameters() if p.requires_grad and SCAFFOLD_ADAPTER in n]
    if not params:
        raise RuntimeError(f"{_SELECTOR}: the scaffold adapter has no trainable parameters.")
    optimizer = torch.optim.AdamW(params, lr=args.lspo_sft_learning_rate, weight_decay=0.0)
    batch = _sft_batch(trainer, prompts, targets, trainer.accelerator.device)
    chunk = args.per_device_train_batch_size
    total = batch["target_mask"].sum().clamp(min=1.0)
    width = batch["target_mask"].size(1)
    was_training = model.training
    model.train()
    losses = []
    with torch.enable_grad():
        for _ in range(args.lspo_sft_steps):
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for start in range(0, len(targets), chunk):
                part = {k: v[start:start + chunk] for k, v in batch.items()}
                with trainer.accelerator.autocast():
                    logits = model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
                logits = logits[:, -width - 1:-1].float()
                labels = part["input_ids"][:, -width:]
                nll = -torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
                loss = (nll * part["target_mask"]).sum() / total
                loss.backward()
                step_loss += loss.item()
            optimizer.step()
            losses.append(step_loss)
    optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    return losses


def _reroll(trainer: Any, inputs: list[dict[str, Any]], rows: list[int], count: int) -> list[list[int]]:
    """One scaffold completion per local row in `rows`, padded with repeats to `count` (one generate call of the
    same size on every process)."""
    fill = rows + [rows[0] if rows else 0] * (count - len(rows))
    prompt_ids, images, multimodal_fields = trainer._tokenize_prompts([copy.deepcopy(inputs[r]["prompt"])
                                                                       for r in fill])
    if images is not None or multimodal_fields:
        raise ValueError(f"{_SELECTOR} supports text prompts only.")
    return [list(c) for c in generate_aside(trainer, prompt_ids)]  # one completion per row


def _scaffold_logps(trainer: Any, model: torch.nn.Module, output: dict[str, Any], rows: list[int],
                    completions: list[list[int]]) -> torch.Tensor:
    """`(len(rows), T)` per-token log-probs of `completions` after the prompts of local `rows` under the scaffold, at
    TRL's temperature (the ratio's scale), zero on padding."""
    pad = trainer._tokenizer.pad_token_id
    width = max(1, max(len(c) for c in completions))
    ids = torch.full((len(rows), width), pad, dtype=output["completion_ids"].dtype)
    mask = torch.zeros((len(rows), width), dtype=output["completion_mask"].dtype)
    for i, c in enumerate(completions):
        ids[i, :len(c)] = torch.tensor(c, dtype=ids.dtype)
        mask[i, :len(c)] = 1
    index = torch.tensor(rows, device=output["prompt_ids"].device)
    sub = {"prompt_ids": output["prompt_ids"].index_select(0, index),
           "prompt_mask": output["prompt_mask"].index_select(0, index),
           "completion_ids": ids.to(index.device), "completion_mask": mask.to(index.device)}
    logps, _ = trainer._rollout_logps(sub, model, compute_entropy=False)
    return logps * sub["completion_mask"]


def scaffold_cliff_groups(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """LSPO on one training generation batch: returns the local `output` with the successful scaffold re-rolls
    spliced in, and updates `trainer._rewards_per_func` (global, identical on every process) at the spliced rows.
    Every process joins the same SFT, generation, log-prob and scoring calls."""
    args, acc = trainer.args, trainer.accelerator
    group_size, procs, rank = trainer.num_generations, acc.num_processes, acc.process_index
    local_n = output["completion_ids"].size(0)
    start = rank * local_n
    threshold = args.lspo_success_threshold
    rewards = weighted_rewards(trainer._rewards_per_func, trainer.reward_weights)
    cliff = cliff_groups(rewards, group_size, threshold)
    metrics = trainer._metrics["train"]
    metrics["groupx/lspo_cliff_groups"].append(float(cliff.sum().item()))
    if not bool(cliff.any()):
        metrics["groupx/lspo_spliced_rows"].append(0.0)
        return output

    # 1. the SFT set: one (prompt, solution) per cliff group, gathered and ordered by group on every process
    pairs, missing = [], None
    try:
        for i in range(local_n):
            g = (start + i) // group_size
            if bool(cliff[g]) and (i == 0 or (start + i) % group_size == 0):
                pairs.append((g, inputs[i]["prompt"], _solution(inputs[i], args.lspo_column)))
    except ValueError as err:
        missing = err
    raise_together(missing, acc, args.lspo_column, selector=_SELECTOR)
    gathered = gather_object(pairs) if procs > 1 else pairs
    by_group = dict(sorted((g, (p, s)) for g, p, s in gathered))  # a group split over processes: once
    tok = trainer._tokenizer
    targets = [reference_completion_ids(args.lspo_template.replace("{ref}", s), tok, tok.eos_token_id,
                                        trainer.max_completion_length) for _, s in by_group.values()]

    # 2.-3. fit the scaffold, re-roll every local cliff slot, take its log-probs; then the scaffold is gone
    mine = [i for i in range(local_n) if bool(cliff[(start + i) // group_size])]
    count = max(int(c) for c in acc.gather(torch.tensor([len(mine)], device=acc.device)).tolist()) if procs > 1 \
        else len(mine)
    with scaffold(trainer) as model:
        losses = fit_scaffold(trainer, model, [p for p, _ in by_group.values()], targets)
        completions = _reroll(trainer, inputs, mine, count)
        filled = mine + [mine[0] if mine else 0] * (count - len(mine))
        lora_policy = is_peft_model(acc.unwrap_model(trainer.model))  # the scaffold is an adapter of trainer.model
        scaffold_logps = _scaffold_logps(trainer, trainer.model if lora_policy else model, output, filled,
                                         completions)
    metrics["groupx/lspo_sft_loss"].append(losses[-1])

    # 4. score the re-rolls (gathered, process order) and choose the splices on the global rows
    scored = score_aside(trainer, [inputs[r] for r in filled], completions)  # (P × count, K)
    scored_rewards = weighted_rewards(scored, trainer.reward_weights)
    global_rows = torch.tensor([start + r if k < len(mine) else -1 for k, r in enumerate(filled)], device=acc.device)
    global_rows = acc.gather(global_rows) if procs > 1 else global_rows
    real = global_rows >= 0
    chosen = splice_rows(global_rows[real].cpu(), scored_rewards[real].cpu(), group_size, threshold)
    success = scored_rewards[real]
    metrics["groupx/lspo_scaffold_success"].append(
        float((success >= threshold).float().mean().item()) if success.numel() else 0.0)
    metrics["groupx/lspo_spliced_rows"].append(float(len(chosen)))
    if not chosen:
        return output

    # 5. splice this process's chosen rows, with the truncated behaviour log-probs
    local_chosen = [r - start for r in chosen if start <= r < start + local_n]
    slot = {r: k for k, r in enumerate(mine)}
    new_ids = [completions[slot[r]] for r in local_chosen]
    if "old_per_token_logps" not in output:  # on-policy batch: the other rows' behaviour is the current policy
        current, _ = trainer._rollout_logps(output, trainer.model, compute_entropy=False)
        output = {**output, "old_per_token_logps": current * output["completion_mask"]}
    output = replace_completions(output, local_chosen, new_ids, tok.pad_token_id, selector=_SELECTOR)
    if trainer.mask_truncated_completions:  # TRL's rule: a completion without EOS at its end is masked
        ends = [*trainer.eos_token_ids, tok.pad_token_id]
        for row, seq in zip(local_chosen, new_ids, strict=True):
            if not seq or seq[-1] not in ends:
                output["completion_mask"][row] = 0
    _recompute_logps(trainer, output, local_chosen)  # current-policy (and reference) log-probs of the new rows
    for row, ids in zip(local_chosen, new_ids, strict=True):
        n = len(ids)
        behaviour = truncated_behaviour_logps(scaffold_logps[slot[row], :n].to(output["old_per_token_logps"]),
                                              output["old_per_token_logps"][row, :n], args.lspo_is_cap)
        output["old_per_token_logps"][row, :n] = behaviour * output["completion_mask"][row, :n]
        if "sampling_per_token_logps" in output:
            output["sampling_per_token_logps"][row, :n] = output["old_per_token_logps"][row, :n]
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    output["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()

    rewards_per_func = trainer._rewards_per_func.clone()
    position = {int(r): k for k, r in enumerate(global_rows.tolist()) if r >= 0}
    targets_rows = torch.tensor(chosen, device=rewards_per_func.device)
    source = torch.tensor([position[r] for r in chosen], device=scored.device)
    rewards_per_func[targets_rows] = scored.index_select(0, source).to(rewards_per_func)
    trainer._rewards_per_func = rewards_per_func
    return output
