"""Stable per-prompt keys for advantage variants that keep per-prompt state (requirement `"prompt_keys"`).

No variant lives here. The trainer calls `prompt_keys_from_ids` on the prompt token ids gathered (padded) across
processes, so every process computes the same `(N,)` keys in global order. Python's `hash()` is salted per process
and per run; BLAKE2b is not, so a key is identical on every process, across runs and after a resume.
"""

from __future__ import annotations

import hashlib

import torch

_KEY_MASK = (1 << 63) - 1  # keep 63 bits: a non-negative int64


def prompt_key(token_ids: list[int] | torch.Tensor) -> int:
    """63-bit BLAKE2b digest of one prompt's token ids (little-endian int64 bytes): a non-negative int."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64).cpu().reshape(-1)
    digest = hashlib.blake2b(ids.numpy().astype("<i8").tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _KEY_MASK


def prompt_keys_from_ids(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """`(N,)` int64 keys of the prompts in `prompt_ids (N, L)`, hashing only the tokens where `prompt_mask` is 1, so
    left or right padding (and padding added when gathering across processes) never changes a key. Two rows get
    the same key exactly when their unpadded prompt token ids are equal (up to a 2^-63 collision chance).

    A loop over rows: `N` is one generation batch (tens to a few thousand rows) and hashing is microseconds a row.
    """
    ids, mask = prompt_ids.detach().cpu(), prompt_mask.detach().cpu().bool()
    return torch.tensor([prompt_key(row[m]) for row, m in zip(ids, mask)], dtype=torch.int64)
