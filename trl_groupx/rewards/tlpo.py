"""Language-consistency reward (the text-GRPO counterpart of TLPO's language-confusion target)."""

from __future__ import annotations

import unicodedata
from typing import Any

from ._utils import column, completion_text

__all__ = ["LANGUAGE_SCRIPTS", "language_consistency_reward", "script_of", "script_share"]

#: ISO 639-1 code → the Unicode scripts its text is written in (script names as in unicodedata character names).
LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("en", "fr", "de", "es", "it", "pt", "nl", "sv", "da", "no", "fi", "pl", "cs", "sk", "ro", "hu", "tr", "id",
         "ms", "vi", "sw", "ca", "hr", "sl", "et", "lv", "lt", "tl"),
        ("LATIN",),
    ),
    **dict.fromkeys(("ru", "uk", "bg", "sr", "mk", "be", "kk"), ("CYRILLIC",)),
    "el": ("GREEK",), "ar": ("ARABIC",), "fa": ("ARABIC",), "ur": ("ARABIC",), "he": ("HEBREW",),
    "hi": ("DEVANAGARI",), "mr": ("DEVANAGARI",), "ne": ("DEVANAGARI",), "bn": ("BENGALI",), "ta": ("TAMIL",),
    "te": ("TELUGU",), "th": ("THAI",), "ka": ("GEORGIAN",), "hy": ("ARMENIAN",),
    "zh": ("CJK",), "ja": ("CJK", "HIRAGANA", "KATAKANA"), "ko": ("HANGUL", "CJK"),
}


def script_of(ch: str) -> str | None:
    """The script of a letter (first word of its Unicode name, ``CJK`` for ideographs), ``None`` for non-letters."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else None


def script_share(text: str, scripts: tuple[str, ...]) -> float | None:
    """Share of the letters of ``text`` written in one of ``scripts``; ``None`` when the text has no letters."""
    letters = [s for s in (script_of(ch) for ch in text) if s is not None]
    if not letters:
        return None
    return sum(s in scripts for s in letters) / len(letters)


def language_consistency_reward(prompts=None, completions=None, completion_ids=None,
                                **kwargs: Any) -> list[float | None]:
    """Language-consistency reward for plain GRPO, the catalog's text-GRPO recipe for TLPO's problem (TLPO,
    "Token-Level Policy Optimization" for language confusion, whose own method is a token-level objective, not a
    reward; catalog id ``tlpo``):

        r = share of the completion's letters written in the script(s) of the target language ∈ [0, 1]

    So a response entirely in the wrong script → 0, entirely in the right one → 1, and code-switching is
    penalised in proportion. Digits, punctuation and whitespace are ignored; a completion without letters
    (empty, or only numbers) → 0 (nothing in the intended language). Choices: a script-level check (it cannot
    tell English from French, which share the Latin script; that needs a language-ID model this package does not
    ship); a continuous share rather than a 0/1 threshold.

    Dataset column: ``language``: an ISO 639-1 code from :data:`LANGUAGE_SCRIPTS` (or a Unicode script name such as
    ``"LATIN"``); ``None`` → ``None``; an unknown code is a ``ValueError``.
    """
    texts = [completion_text(c) for c in (completions or [])]
    langs = column(kwargs, "language", len(texts))
    out: list[float | None] = []
    for text, lang in zip(texts, langs, strict=True):
        if lang is None:
            out.append(None)
            continue
        key = str(lang).strip()
        scripts = LANGUAGE_SCRIPTS.get(key.lower()) or ((key.upper(),) if key.isupper() else None)
        if scripts is None:
            raise ValueError(f"language_consistency_reward: unknown language {lang!r}; use one of "
                             f"{sorted(LANGUAGE_SCRIPTS)} or a Unicode script name like 'LATIN'.")
        share = script_share(text, scripts)
        out.append(0.0 if share is None else share)
    return out
