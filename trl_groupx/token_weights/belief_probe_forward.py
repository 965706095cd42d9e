"""Trainer glue of `token_weighting="belief_probe"` (GRPO-VPS): the requirement `answer_belief`.

For every completion of this process: its cut points (`belief_probe.entropy_cut_points` or `delimiter_cut_points`),
then one teacher-forced probe per distinct boundary, `prompt + completion[:c_k] + template + answer`, run without
grad through the training model in chunks; the answer tokens' log-probs are summed. Results are gathered so that
every process holds the global `(N, T)` segment ids and `(N, K + 1)` answer log-probs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .belief_probe import (
    ANSWER_PLACEHOLDER,
    NO_SEGMENT,
    VARIANT_ID,
    completion_boundaries,
    delimiter_cut_points,
    entropy_cut_points,
    segment_ids_from_boundaries,
)

SELECTOR = f"token_weighting={VARIANT_ID!r}"
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes")


def check_belief_probe(trainer: Any) -> None:
    """Construction-time refusal: the training dataset must hold the reference answers."""
    column = trainer.args.belief_probe_answer_column
    columns = getattr(trainer.train_dataset, "column_names", None)
    if columns is not None and column not in columns:
        raise ValueError(
            f"{SELECTOR} appends each prompt's reference answer from the dataset column belief_probe_answer_column="
            f"{column!r}, which train_dataset lacks (columns: {list(columns)}); add the column or set "
            "belief_probe_answer_column to the one that holds the answers."
        )


def reference_answer(row: dict[str, Any], column: str) -> str:
    """The reference answer of a dataset row; a clear error where it has none."""
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{SELECTOR}: a row has no reference answer in belief_probe_answer_column={column!r} (value "
                         f"{value!r}); fill the column for every row or filter such rows out.")
    return str(value)


@torch.no_grad()
def probe_answer_logps(
    model: Any,
    sequences: Sequence[Sequence[int]],
    answer_lengths: Sequence[int],
    *,
    pad_token_id: int,
    temperature: float,
    chunk_size: int,
    min_forwards: int = 0,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """`(P,)` float32: `Σ_m log softmax(logits / temperature)[a_m]` over the last `answer_lengths[p]` tokens of each
    teacher-forced sequence `p`, one forward per chunk of `chunk_size` sequences.

    Sequences are left-padded within a chunk with explicit `position_ids` counted from each one's first real token,
    so padding is neither attended nor shifts a position: every value equals the unpadded sequence's own forward.
    Only the last `max answer length + 1` positions get logits. With `min_forwards`, discarded forwards of one
    token follow until that many ran (sharded models need the same number of forwards on every process)."""
    out = torch.empty(len(sequences), dtype=torch.float32)
    starts = list(range(0, len(sequences), chunk_size))
    forwards = 0
    for start in starts:
        chunk = range(start, min(start + chunk_size, len(sequences)))
        width = max(len(sequences[p]) for p in chunk)
        keep = max(answer_lengths[p] for p in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, p in enumerate(chunk):
            ids[row, width - len(sequences[p]) :] = torch.as_tensor(sequences[p], dtype=torch.long)
            mask[row, width - len(sequences[p]) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with autocast():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep + 1,
                           use_cache=False).logits
        # kept positions width-keep-1 … width-1; position j predicts token j+1: the last `keep` tokens
        logps = torch.log_softmax(logits[:, -(keep + 1) : -1].float() / temperature, dim=-1)
        logps = logps.gather(-1, ids[:, -keep:].unsqueeze(-1)).squeeze(-1)
        lengths = torch.as_tensor([answer_lengths[p] for p in chunk], device=logps.device)
        scored = torch.arange(keep, device=logps.device)[None, :] >= (keep - lengths)[:, None]
        out[start : start + len(chunk)] = torch.where(scored, logps, torch.zeros_like(logps)).sum(-1).cpu()
        forwards += 1
        del logits
    while forwards < min_forwards:  # discarded: keeps collective forwards aligned across processes
        ids = torch.full((1, 1), pad_token_id, dtype=torch.long, device=device)
        with autocast():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1, use_cache=False)
        forwards += 1
    return out


def _cut_points(args: Any, entropies: torch.Tensor | None, ids: list[int], length: int, tokenizer: Any) -> list[int]:
    k = args.belief_probe_max_segments
    if args.belief_probe_segmentation == "delimiter":
        texts = [tokenizer.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False) for t in ids]
        return delimiter_cut_points(texts, length, k, args.belief_probe_delimiter)
    if entropies is None:
        raise ValueError(f"{SELECTOR} with belief_probe_segmentation='entropy' needs the rollout entropies.")
    return entropy_cut_points(entropies, length, k, args.belief_probe_entropy_top_fraction)


def local_probes(trainer: Any, output: dict[str, Any], entropies: torch.Tensor | None,
                 rows: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, list[tuple[int, list[int]]], list[list[int]],
                                                          list[int]]:
    """This process's `(B, T)` segment ids and its probes: for each, `(local row, boundary indices it serves)`, the
    token ids and the answer length. A boundary repeated within a row (a completion of only EOS) is probed once."""
    args, tokenizer = trainer.args, trainer._tokenizer
    completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
    b, t = completion_ids.shape
    segments = torch.full((b, t), NO_SEGMENT, dtype=torch.long)
    before = args.belief_probe_answer_template.split(ANSWER_PLACEHOLDER)[0]
    before_ids = list(tokenizer(before, add_special_tokens=False)["input_ids"]) if before else []
    eos = set(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    targets: list[tuple[int, list[int]]] = []
    sequences: list[list[int]] = []
    answer_lengths: list[int] = []
    for i in range(b):
        n = int(completion_mask[i].sum().item())
        if n == 0:
            continue
        ids = completion_ids[i, :n].tolist()
        ends_with_eos = ids[-1] in eos
        content = n - 1 if ends_with_eos else n
        cuts = _cut_points(args, None if entropies is None else entropies[i], ids, content, tokenizer)
        boundaries = completion_boundaries(n, ends_with_eos, cuts)
        segments[i] = segment_ids_from_boundaries(boundaries, n, t)
        answer = list(tokenizer(reference_answer(rows[i], args.belief_probe_answer_column),
                                add_special_tokens=False)["input_ids"])
        prompt = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
        for c in sorted(set(boundaries)):
            targets.append((i, [k for k, b_k in enumerate(boundaries) if b_k == c]))
            sequences.append(prompt + ids[:c] + before_ids + answer)
            answer_lengths.append(len(answer))
    return segments, targets, sequences, answer_lengths


def answer_belief(trainer: Any, output: dict[str, Any],
                  entropies: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Requirement `answer_belief`: global `(N, T)` segment ids and `(N, K + 1)` answer log-probs (float32, NaN past
    each row's last boundary), identical on every process. Evaluation batches are not probed (all −1 / NaN: the
    variant then gives GRPO's advantages)."""
    from ..sampling.reference_injection import raise_together

    acc, args = trainer.accelerator, trainer.args
    if any(output.get(k) is not None for k in _MULTIMODAL_KEYS):
        raise ValueError(f"{SELECTOR} probes text completions only; the batch carries image inputs.")
    completion_ids = output["completion_ids"]
    b, t = completion_ids.shape
    logps = torch.full((b, args.belief_probe_max_segments + 1), math.nan, dtype=torch.float32)
    segments = torch.full((b, t), NO_SEGMENT, dtype=torch.long)
    if trainer.model.training:
        error = None
        try:
            segments, targets, sequences, answer_lengths = local_probes(trainer, output, entropies,
                                                                        trainer._rollout_inputs)
        except ValueError as err:  # a blank answer: every process raises, none waits in a collective call
            error, targets, sequences, answer_lengths = err, [], [], []
        raise_together(error, acc, args.belief_probe_answer_column, SELECTOR)
        chunk = args.per_device_train_batch_size
        forwards = -(-len(sequences) // chunk)
        if acc.num_processes > 1:
            forwards = int(acc.gather(torch.tensor([forwards], device=acc.device)).max().item())
        pad = trainer._tokenizer.pad_token_id
        values = probe_answer_logps(
            trainer.model, sequences, answer_lengths, pad_token_id=0 if pad is None else pad,  # never attended
            temperature=trainer.temperature, chunk_size=chunk, min_forwards=forwards, autocast=acc.autocast,
            device=completion_ids.device,
        )
        for (row, boundary_ks), value in zip(targets, values.tolist(), strict=True):
            for k in boundary_ks:
                logps[row, k] = value
        trainer._metrics["train"]["groupx/belief_probe_probes_per_completion"].append(
            len(sequences) / max(1, int((output["completion_mask"].sum(-1) > 0).sum().item())))
    device = completion_ids.device
    segments = acc.pad_across_processes(segments.to(device), dim=1, pad_index=NO_SEGMENT)
    return acc.gather(segments), acc.gather(logps.to(device))
