"""tlpo: share of letters in the target language's script."""

import pytest

from trl_groupx.rewards import language_consistency_reward
from trl_groupx.rewards.tlpo import script_share


def test_catalog_check_and_shares():
    comps = ["Bonjour, ça va ?", "Привет", "hello мир", "東京に行きます", "123 !!", ""]
    langs = ["fr", "fr", "en", "ja", "en", "de"]
    # right script → 1 ; wrong script → 0 ; "hello"(5 Latin) + "мир"(3 Cyrillic) → 5/8 ; kanji + kana → 1 ;
    # no letters → 0 ; empty → 0
    assert language_consistency_reward(completions=comps, language=langs) == [1.0, 0.0, 5 / 8, 1.0, 0.0, 0.0]


def test_edges():
    out = language_consistency_reward(
        completions=[[{"role": "assistant", "content": "Ελληνικά"}], "abc", "abc"], language=["el", None, "LATIN"]
    )
    assert out == [1.0, None, 1.0]
    assert language_consistency_reward(completions=["x"]) == [None]
    with pytest.raises(ValueError, match="unknown language"):
        language_consistency_reward(completions=["x"], language=["xx"])
    assert script_share("", ("LATIN",)) is None
