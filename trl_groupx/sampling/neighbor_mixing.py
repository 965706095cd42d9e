"""Generation and replay glue of N-GRPO's Semantic Neighbor Mixing (`rollout_filter="n_grpo"`; the formula, the
citations and the choices are in `trl_groupx/sampling/n_grpo.py`).

- Generation: `generate_with_neighbor_mixing` wraps TRL's `_generate_single_turn` in training (not for the extra
  baseline completions of remax/aapo). For each transformers `generate` call a `NeighborMixer` is appended to the
  logits processors and hooks the model's input embedding layer: the processor prepares each step's candidates and
  weights, the hook (on the next forward, whose input is the token just sampled) settles which rows mix, stores the
  step and puts the mixed vector in place of the token's embedding.
- Replay: the stored `(N, T, K)` ids and weights of the local batch are `trainer._n_grpo_replay` from generation on
  (TRL's old and reference forwards, the token stage's forwards), ride with the rows as `n_grpo_mix_ids` /
  `n_grpo_mix_weights` (`attach_mixing_records`), and are set again from each micro-batch in `_compute_loss`.
  `replayed_logps` runs the trainer's log-prob method under a hook that replaces the embeddings of the last `T`
  positions (the completion) of each forwarded row, rows taken in order.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import LogitsProcessor

from .adaptive_temperature import _appended_to_generate
from .n_grpo import (
    MIX_RATE,
    THINK_END,
    TOP_K,
    VARIANT_ID,
    candidate_weights,
    mixed_embeddings,
    sampling_probs,
    semantic_neighbours,
)

IDS_KEY, WEIGHTS_KEY = "n_grpo_mix_ids", "n_grpo_mix_weights"


def check_generation_path(trainer: Any) -> None:
    """Construction-time check: the mixed inputs are fed inside TRL's own single-turn transformers generation."""
    for name in ("rollout_func", "tools", "environments"):
        if getattr(trainer, name, None):
            raise ValueError(f"rollout_filter={VARIANT_ID!r} feeds mixed embeddings inside TRL's own single-turn "
                             f"generation, but this trainer has {name}; drop them or the variant.")


def _mix_tail(output: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, embed: Callable) -> torch.Tensor | None:
    """`(b, L, H)` embeddings with their last `T` positions replaced by `Σ_j w_j E_{c_j}` where the `(b, T, K)`
    weights are not all zero; `None` (unchanged) if none mixes."""
    mixed = weights.sum(-1) > 0
    if not mixed.any():
        return None
    tail = output[:, -ids.size(1):]
    tail = torch.where(mixed.unsqueeze(-1), mixed_embeddings(embed(ids), weights), tail)
    return torch.cat([output[:, : output.size(1) - ids.size(1)], tail], dim=1)


class _EmbeddingHook:
    """A forward hook on the input embedding layer that does not hook its own lookups of the candidates."""

    def __init__(self) -> None:
        self._inside = False

    def embed(self, module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        self._inside = True
        try:
            return module(ids)
        finally:
            self._inside = False


class NeighborMixer(LogitsProcessor, _EmbeddingHook):
    """One `generate` call's mixing: a logits processor (leaves the scores unchanged) plus the embedding hook."""

    def __init__(self, embedding: torch.nn.Module, *, mix_rate: float, top_k: int, think_end_ids: list[int],
                 temperature: float, sampling_top_k: int | None, sampling_top_p: float | None, seed: int):
        super().__init__()
        self.embedding, self.mix_rate, self.top_k, self.seed = embedding, float(mix_rate), int(top_k), seed
        self.think_end = think_end_ids
        self.sampling = (temperature, sampling_top_k, sampling_top_p)
        self.unit_table: torch.Tensor | None = None
        self.generator: torch.Generator | None = None
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.recent: torch.Tensor | None = None  # (B, len(think_end)) last generated ids
        self.ended: torch.Tensor | None = None  # (B,) think end generated
        self.ids: list[torch.Tensor] = []  # per fed completion token, (B, K)
        self.weights: list[torch.Tensor] = []  # per fed completion token, (B, K), zero = not mixed

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, device = scores.size(0), scores.device
        if self.generator is None:
            self.generator = torch.Generator(device=device).manual_seed(self.seed)
        draw = (torch.rand(rows, generator=self.generator, device=device) < self.mix_rate if self.mix_rate > 0
                else torch.zeros(rows, dtype=torch.bool, device=device))
        candidates = torch.zeros(rows, self.top_k, dtype=torch.long, device=device)
        weights = torch.zeros(rows, self.top_k, device=device)
        if draw.any():
            if self.unit_table is None:  # the weights do not change during one generate call
                table = self.embedding.weight.detach()[: scores.size(-1)].float()
                self.unit_table = torch.nn.functional.normalize(table, dim=-1)
            probs = sampling_probs(scores, *self.sampling)
            candidates = semantic_neighbours(self.unit_table, probs.argmax(-1), self.top_k)
            weights = candidate_weights(probs, candidates)
        self.pending = (candidates, weights, draw)
        return scores

    def _think_ended(self, token: torch.Tensor) -> torch.Tensor:
        if self.ended is None:
            self.ended = torch.zeros_like(token, dtype=torch.bool)
            self.recent = torch.full((token.size(0), len(self.think_end)), -1, dtype=token.dtype, device=token.device)
        if self.think_end:
            self.recent = torch.cat([self.recent[:, 1:], token[:, None]], dim=1)
            self.ended |= (self.recent == torch.tensor(self.think_end, device=token.device)).all(-1)
        return self.ended

    def hook(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if self._inside or self.pending is None:  # the prompt's forward, or a candidate lookup
            return None
        candidates, weights, draw = self.pending
        self.pending = None
        mixes = draw & ~self._think_ended(args[0][:, -1])  # the token just sampled counts (official)
        self.ids.append(candidates)
        self.weights.append(weights * mixes[:, None])
        n = min(output.size(1), len(self.ids))  # 1 with a KV cache; every fed token without one
        return _mix_tail(output, torch.stack(self.ids[-n:], 1), torch.stack(self.weights[-n:], 1),
                         lambda ids: self.embed(module, ids))

    def records(self, length: int, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, length, K)` ids and weights of the completion tokens (unfed ones unmixed). `rows` = B, needed when
        no step was fed (one-token completions: nothing recorded, every token unmixed)."""
        if self.ids:
            rows = self.ids[0].size(0)
        elif rows is None:
            raise ValueError("records() of a mixer that fed no step needs the number of rows")
        ids = torch.stack(self.ids, 1) if self.ids else torch.zeros(rows, 0, self.top_k, dtype=torch.long)
        weights = torch.stack(self.weights, 1) if self.weights else torch.zeros(rows, 0, self.top_k)
        return _fit(ids, length), _fit(weights, length)


def _fit(x: torch.Tensor, length: int) -> torch.Tensor:
    """Cut or zero-pad dim 1 of `x` to `length`."""
    if x.size(1) >= length:
        return x[:, :length]
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.size(1)))


def _call_seed(trainer: Any, call: int) -> int:
    key = f"{trainer.args.seed}/{trainer.state.global_step}/{trainer.accelerator.process_index}/{call}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1


def generate_with_neighbor_mixing(trainer: Any, generate: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`generate(*args, **kwargs)` (TRL's `_generate_single_turn`) with a `NeighborMixer` on every transformers
    `generate` call it makes; the calls' records become `trainer._n_grpo_replay` (rows in call order)."""
    args_, config = trainer.args, trainer.generation_config
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)  # what TRL's unwrap_model_for_generation yields
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    end = getattr(args_, THINK_END)
    think_end_ids = tokenizer.encode(end, add_special_tokens=False) if end else []
    records: list = trainer.__dict__.setdefault("_n_grpo_records", [])
    handles: list = []

    def make_processor() -> NeighborMixer:
        mixer = NeighborMixer(model.get_input_embeddings(), mix_rate=getattr(args_, MIX_RATE),
                              top_k=getattr(args_, TOP_K), think_end_ids=think_end_ids,
                              temperature=config.temperature or 1.0, sampling_top_k=config.top_k,
                              sampling_top_p=config.top_p, seed=_call_seed(trainer, len(records)))
        handles.append(model.get_input_embeddings().register_forward_hook(mixer.hook))
        return mixer

    def keep(mixer: NeighborMixer, completion_ids: torch.Tensor, prompt: torch.Tensor) -> None:
        handles.pop().remove()
        records.append(mixer.records(completion_ids.size(1), rows=completion_ids.size(0)))

    try:
        with _appended_to_generate(model, make_processor, keep):
            result = generate(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if records:
        width = max(r[0].size(1) for r in records)
        trainer._n_grpo_replay = tuple(torch.cat([_fit(r[i], width) for r in records]) for i in range(2))
    return result


def start_generation_batch(trainer: Any) -> None:
    trainer._n_grpo_records = []
    trainer._n_grpo_replay = None


def attach_mixing_records(trainer: Any, output: dict[str, Any]) -> None:
    """Put the local batch's records on `output` (shuffled and split with the rows by TRL), zero after each row's
    EOS, and log the share of mixed completion tokens (`n_grpo/mixed_token_fraction`)."""
    replay = getattr(trainer, "_n_grpo_replay", None)
    if replay is None:  # evaluation: nothing mixed
        return
    mask = output["completion_mask"]
    ids, weights = (_fit(x, mask.size(1)).to(mask.device) for x in replay)
    if ids.size(0) != mask.size(0):
        raise RuntimeError(f"rollout_filter={VARIANT_ID!r}: {ids.size(0)} mixing records for {mask.size(0)} rows.")
    weights = weights * mask.unsqueeze(-1).to(weights.dtype)
    output[IDS_KEY], output[WEIGHTS_KEY] = ids, weights
    trainer._n_grpo_replay = (ids, weights)
    counts = torch.stack([(weights.sum(-1) > 0).sum(), mask.sum()]).float()
    counts = trainer.accelerator.reduce(counts, reduction="sum") if trainer.accelerator.num_processes > 1 else counts
    trainer._metrics["train"]["n_grpo/mixed_token_fraction"].append((counts[0] / counts[1].clamp(min=1)).item())


def set_loss_replay(trainer: Any, inputs: dict[str, Any]) -> None:
    """`_compute_loss`: this micro-batch's rows replay their own records (none in evaluation)."""
    trainer._n_grpo_replay = (inputs[IDS_KEY], inputs[WEIGHTS_KEY]) if IDS_KEY in inputs else None


@contextlib.contextmanager
def replaying(embedding: torch.nn.Module, ids: torch.Tensor, weights: torch.Tensor) -> Iterator[None]:
    """Forwards through `embedding` take rows `0..N-1` of the `(N, T, K)` records in order and mix the last `T`
    positions of each row; every row must be forwarded exactly once."""
    hook, cursor = _EmbeddingHook(), [0]

    def replace(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if hook._inside:
            return None
        rows = slice(cursor[0], cursor[0] + output.size(0))
        cursor[0] = rows.stop
        return _mix_tail(output, ids[rows].to(output.device), weights[rows].to(output.device),
                         lambda x: hook.embed(module, x))

    handle = embedding.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()
    if cursor[0] != ids.size(0):
        raise RuntimeError(f"rollout_filter={VARIANT_ID!r}: a log-prob forward fed {cursor[0]} rows for "
                           f"{ids.size(0)} mixing records.")


def replayed_logps(trainer: Any, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   logits_to_keep: int, **kwargs: Any) -> Any:
    """The trainer's `_get_per_token_logps_and_entropies` on the rollout's mixed inputs (`trainer._n_grpo_replay`),
    or on the plain inputs when there is nothing to replay (evaluation)."""
    replay = getattr(trainer, "_n_grpo_replay", None)
    trainer._n_grpo_replaying = True
    try:
        if replay is None:
            return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              **kwargs)
        ids, weights = replay
        if ids.size(0) != input_ids.size(0):
            raise RuntimeError(f"rollout_filter={VARIANT_ID!r}: {ids.size(0)} mixing records for a log-prob forward "
                               f"of {input_ids.size(0)} rows (a forward outside the rollout batch).")
        ids, weights = _fit(ids, logits_to_keep), _fit(weights, logits_to_keep)
        embedding = trainer.accelerator.unwrap_model(model).get_input_embeddings()
        with replaying(embedding, ids, weights):
            return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              **kwargs)
    finally:
        trainer._n_grpo_replaying = False
