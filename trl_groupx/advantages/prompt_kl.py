"""Per-prompt policy drift since the prompt's last visit (requirement `"prompt_kl"`, SPO's KL-adaptive ρ).

No variant lives here. The trainer keeps, per prompt key, the response of the prompt's last visit and its per-token
log-probs under the policy of that visit (`PromptResponseStore`, one entry per prompt), re-scores the stored
responses of the current batch's prompts with the current model, and passes each row's

    D = masked mean over the stored completion tokens of |log π_stored − log π_current|

as `prompt_kl (N,)` (NaN for a prompt never stored). Then it replaces the entries of the batch's prompts by this
visit's responses and their log-probs under the current model.

Which policies D compares (a **choice**, documented in `spo_single`'s docstring): the official trainer computes ρ
after the actor update of visit `t` and stores the log-probs under the updated policy, so its D compares θ_{s+1}
with θ_{t+1} (`s` the previous visit). Here the advantage stage runs before the update of visit `t`, and the
tracker update is applied there, so D compares θ_s with θ_t (the weights that generated each batch): the same
number `t − s` of policy updates, the window shifted one update earlier.

Store layout: `{key (int): {"prompt_ids", "completion_ids", "completion_mask", "logps"}}` with unpadded 1-D CPU
tensors (int64, int64, int64, float32): tensors of different lengths, no padding kept; one entry per distinct
prompt ever scored (the last scored rollout of its last visit, as the official code keeps the last row), so the
store is bounded by the dataset's distinct prompts × one prompt+completion. It lives in `trainer.variant_state`
and is saved with every checkpoint (`torch.save`, reloaded with `weights_only=True`: ints, dicts and tensors).

Multi-process: the store is updated from gathered tensors, so every process holds the same store; the stored
responses to re-score are split over the processes in equal slices (each process runs the same number of
forwards, as sharded models need) and the per-prompt D values are gathered.
"""

from __future__ import annotations

from typing import Any

import torch

PromptResponseStore = dict[int, dict[str, torch.Tensor]]


def prompt_kl_enabled(variant: Any, args: Any) -> bool:
    """A variant may make `prompt_kl` conditional on a `<id>_rho_mode` param: computed only when it is `"kl"`."""
    mode_fields = [p for p in variant.params if p.endswith("_rho_mode")]
    return all(getattr(args, f) == "kl" for f in mode_fields)


def masked_mean_abs_diff(old: torch.Tensor, cur: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(R,)` mean over the tokens where `mask` is 1 of `|old − cur|` (0 for a row with no token, as verl's
    `masked_mean` gives with its epsilon)."""
    m = mask.bool()
    diff = torch.where(m, (old.to(torch.float64) - cur.to(torch.float64)).abs(), 0.0)  # padding never read
    return diff.sum(-1) / m.sum(-1).to(torch.float64).clamp(min=1.0)


def last_scored_rows(keys: torch.Tensor, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(unique keys (U,), index of the last row of each with a non-NaN reward (U,), −1 when none)`."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    rows = torch.arange(keys.numel())
    rows = torch.where(torch.isnan(rewards.detach().cpu()), torch.full_like(rows, -1), rows)
    last = torch.full((unique.numel(),), -1, dtype=torch.int64).scatter_reduce(0, inverse, rows, reduce="amax")
    return unique, last


def entry_from_row(prompt_ids, prompt_mask, completion_ids, completion_mask, logps) -> dict[str, torch.Tensor]:
    """One store entry from one row of padded tensors: the prompt's real tokens, the completion up to its last
    real token."""
    prompt = prompt_ids[prompt_mask.bool()].to(torch.int64)
    real = completion_mask.nonzero()
    length = int(real.max()) + 1 if real.numel() else 0
    return {"prompt_ids": prompt.cpu().clone(), "completion_ids": completion_ids[:length].to(torch.int64).cpu().clone(),
            "completion_mask": completion_mask[:length].to(torch.int64).cpu().clone(),
            "logps": logps[:length].float().cpu().clone()}


def pad_entries(entries: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Batch of stored responses: prompts left-padded, completions right-padded (pad id 0: masked out)."""
    p_len = max(1, max(e["prompt_ids"].numel() for e in entries))
    c_len = max(1, max(e["completion_ids"].numel() for e in entries))
    n = len(entries)
    out = {"prompt_ids": torch.zeros(n, p_len, dtype=torch.int64), "prompt_mask": torch.zeros(n, p_len, dtype=torch.int64),
           "completion_ids": torch.zeros(n, c_len, dtype=torch.int64),
           "completion_mask": torch.zeros(n, c_len, dtype=torch.int64), "logps": torch.zeros(n, c_len)}
    for i, e in enumerate(entries):
        p, c = e["prompt_ids"].numel(), e["completion_ids"].numel()
        out["prompt_ids"][i, p_len - p:] = e["prompt_ids"]
        out["prompt_mask"][i, p_len - p:] = 1
        out["completion_ids"][i, :c] = e["completion_ids"]
        out["completion_mask"][i, :c] = e["completion_mask"]
        out["logps"][i, :c] = e["logps"]
    return out


def rescore_stored(trainer, entries: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """`(len(entries),)` D of each stored response under `trainer.model`, identical on every process: each process
    scores an equal slice (padded with repeats of the last entry), then the slices are gathered."""
    if not entries:
        return torch.zeros(0, dtype=torch.float64)
    accelerator = trainer.accelerator
    procs, rank = accelerator.num_processes, accelerator.process_index
    per_proc = -(-len(entries) // procs)
    mine = entries[rank * per_proc : (rank + 1) * per_proc]
    mine = mine + [entries[-1]] * (per_proc - len(mine))  # equal forward counts on every process
    batch = pad_entries(mine)
    device = accelerator.device
    batch = {k: v.to(device) for k, v in batch.items()}
    cur, _ = trainer._rollout_logps(batch, trainer.model, compute_entropy=False)
    d = masked_mean_abs_diff(batch["logps"], cur, batch["completion_mask"])
    if procs > 1:
        d = accelerator.gather(d)
    return d.cpu()[: len(entries)]


def compute_prompt_kl(trainer, output: dict[str, Any], keys: torch.Tensor, rewards: torch.Tensor,
                      store: PromptResponseStore) -> torch.Tensor:
    """`(N,)` float64 D of each row's prompt (NaN for a prompt not in `store`), then `store` updated in place with
    this visit's responses (the last scored row of each prompt) and their log-probs under the current model."""
    if any(k in output for k in ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes")):
        raise NotImplementedError("The prompt_kl requirement re-scores stored responses from token ids only; "
                                  "multimodal inputs are not stored. Use a constant rho for multimodal models.")
    unique, inverse = torch.unique(keys.cpu(), return_inverse=True)
    found = [int(k) for k in unique.tolist() if int(k) in store]
    d_found = rescore_stored(trainer, [store[k] for k in found])
    d_u = torch.full((unique.numel(),), float("nan"), dtype=torch.float64)
    position = {k: i for i, k in enumerate(unique.tolist())}
    for k, d in zip(found, d_found.tolist()):
        d_u[position[k]] = d

    logps = output.get("old_per_token_logps")  # TRL's no-grad log-probs under the current model, when computed
    if logps is None:
        logps, _ = trainer._rollout_logps(output, trainer.model, compute_entropy=False)
    mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
    gathered = [trainer._gather_padded(t).cpu() for t in
                (output["prompt_ids"], output["prompt_mask"], output["completion_ids"], mask, logps)]
    _, last = last_scored_rows(keys.cpu(), rewards)
    for key, row in zip(unique.tolist(), last.tolist()):
        if row >= 0:
            store[int(key)] = entry_from_row(*(t[row] for t in gathered))
    return d_u[inverse]
