"""Config-time refusals shared by the sampling variants that own generation and the log-prob forward (`n_grpo`'s
mixed input embeddings, `logit_avg`'s mixed logits): settings and other stages' requirements that would generate
or score outside them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..registry import get_variant


def refuse_bypasses(config: Any, variant_id: str, refused: Mapping[str, str], does: str, verb: str) -> None:
    """Raise for the first truthy `flag` of `refused` (flag → what runs instead), naming it and the fix:
    "rollout_filter=<id> <does>, which <what> (<flag>) <verb>; set <flag> off or drop rollout_filter=<id>"."""
    for flag, what in refused.items():
        if getattr(config, flag, None):
            raise ValueError(f"rollout_filter={variant_id!r} {does}, which {what} ({flag}) {verb}; set {flag} off or "
                             f"drop rollout_filter={variant_id!r}.")


def refuse_own_forwards(config: Any, requirements: Iterable[str], would_not: str) -> None:
    """Raise when a variant of another stage needs one of `requirements` (a forward or a generation of its own,
    which would not `would_not`)."""
    for stage, vid in config.active_variants().items():
        needs = set(get_variant(vid).requires) & set(requirements)
        if needs and stage != "sampling":
            raise ValueError(f"{get_variant(vid).selector}={vid!r} needs {sorted(needs)} from a forward or a generation "
                             f"of its own that would not {would_not}; drop one of the two.")
