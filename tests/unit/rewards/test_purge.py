"""purge: 1 for clean text, 0 for any forbidden-concept mention (case-insensitive, whole words)."""

import pytest

from trl_groupx.rewards import ForbiddenConceptReward, forbidden_concept_reward
from trl_groupx.rewards.purge import mentions


def test_catalog_check():
    concepts = ["Harry Potter", "Hogwarts"]
    texts = ["I cannot discuss that.", "He studied at HOGWARTS.", "harry   potter is a wizard", "Potterton Hogwartsy"]
    assert forbidden_concept_reward(completions=texts, forbidden_concepts=[concepts] * 4) == [1.0, 0.0, 0.0, 1.0]


def test_string_cell_and_edges():
    out = forbidden_concept_reward(
        completions=["", [{"role": "assistant", "content": "about C++ today"}], "anything", "x"],
        forbidden_concepts=["Dumbledore|Snape", ["C++"], [], None],
    )
    # empty completion is clean ; "C++" (ends in non-word char) still matched ; empty list → clean ; None → None
    assert out == [1.0, 0.0, 1.0, None]
    assert forbidden_concept_reward(completions=["a"]) == [None]
    assert mentions("Snape and dumbledore", ["Dumbledore", "Snape", "Voldemort"]) == ["Dumbledore", "Snape"]


def test_custom_values():
    r = ForbiddenConceptReward(clean_reward=1.0, violation_reward=-1.0)
    assert r(completions=["Hogwarts", "ok"], forbidden_concepts=[["hogwarts"]] * 2) == [-1.0, 1.0]
    with pytest.raises(ValueError):
        ForbiddenConceptReward(clean_reward=0.0, violation_reward=0.0)
