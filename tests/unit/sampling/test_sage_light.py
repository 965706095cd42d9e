"""SAGE-light's pure parts: the hint-level transition (official `fit` lines 870-895), the prompt key, config refusals."""

import pytest

import trl_groupx
from trl_groupx.sampling.sage import next_hint_level, prompt_digest


@pytest.mark.parametrize("level, accuracy, expected", [
    (0, None, 0),    # first visit: no hint
    (2, None, 0),    # no accuracy recorded: no hint (official: prev_acc None -> no_hint)
    (0, 0.0, 1),     # accuracy <= 0 (official min): one level up
    (1, 0.0, 2),
    (3, 0.0, 3),     # capped at level 3
    (3, 0.5, 2),     # accuracy > 0.35: one level down
    (1, 0.36, 0),
    (0, 1.0, 0),     # already unhinted
    (2, 0.25, 2),    # inside (0, 0.35]: unchanged
    (2, 0.35, 2),    # the upper bound itself keeps the level (strictly above moves down)
])
def test_next_hint_level_official_defaults(level, accuracy, expected):
    assert next_hint_level(level, accuracy, 0.0, 0.35) == expected


def test_next_hint_level_with_a_positive_lower_bound():
    # a_min = 0.1: 1 of 8 correct (0.125) keeps the level, 0 of 8 or an accuracy of exactly 0.1 raises it
    assert next_hint_level(1, 0.125, 0.1, 0.35) == 1
    assert next_hint_level(1, 0.1, 0.1, 0.35) == 2


def test_prompt_digest_is_stable_and_distinguishes_prompts():
    chat = [{"role": "user", "content": "1 + 2 ="}]
    assert prompt_digest(chat) == prompt_digest([{"content": "1 + 2 =", "role": "user"}])  # key order irrelevant
    assert prompt_digest(chat) != prompt_digest([{"role": "user", "content": "1 + 3 ="}])
    assert prompt_digest("1 + 2 =") != prompt_digest(chat)
    assert len(prompt_digest("x")) == 32  # 16-byte BLAKE2b, hex


def _config(**kw):
    return trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, rollout_filter="sage", **kw)


def test_defaults_are_the_official_values():
    cfg = _config()
    assert (cfg.sage_method, cfg.sage_light_accuracy_min, cfg.sage_light_accuracy_max) == ("sage", 0.0, 0.35)


@pytest.mark.parametrize("kw, match", [
    ({"sage_method": "sage-light"}, "sage_method='sage-light'"),
    ({"sage_method": "light", "sage_light_accuracy_min": 0.5, "sage_light_accuracy_max": 0.2}, "min <= max"),
    ({"sage_method": "light", "sage_light_accuracy_max": 1.5}, "sage_light_accuracy_max=1.5"),
    ({"sage_light_accuracy_max": 0.5}, "only apply with sage_method='light'"),
])
def test_bad_values_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)
