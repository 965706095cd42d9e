"""The table of sampling hooks around generation: every entry is a registered sampling variant, every hook resolves
to a function adapted to its point's signature, and the adapters call it as declared (hand-made fakes)."""

import pytest

import trl_groupx
from trl_groupx.sampling import generation_hooks
from trl_groupx.sampling.generation_hooks import HOOKS, GenerationHooks, Hook, _adapt


@pytest.mark.parametrize("variant_id", sorted(HOOKS))
def test_every_entry_is_a_sampling_variant_whose_hooks_resolve(variant_id):
    variant = trl_groupx.get_variant(variant_id)
    assert variant.stage == "sampling"
    hooks = GenerationHooks(variant)
    assert set(hooks._hooks) == set(HOOKS[variant_id]) and all(callable(fn) for fn, _ in hooks._hooks.values())


def test_no_variant_means_no_hook():
    hooks = GenerationHooks(None)
    inputs, output = ["row"], {"x": 1}
    assert hooks.before(None, inputs, True) is inputs
    assert hooks.after_generation(None, inputs, output, None, True) == (inputs, output)
    assert hooks.after_stages(None, inputs, output, True) is output
    assert hooks.append_rows(None, inputs, output, True) is output


def test_adapters_call_as_declared():
    calls = []
    assert _adapt(lambda t, i: i + ["new"], "rows", "before")("T", ["a"]) == ["a", "new"]
    assert _adapt(lambda t: calls.append(t), "reset", "before")("T", ["a"]) == ["a"] and calls == ["T"]
    pair = _adapt(lambda t, i, o, g: (i + [g], {**o, "p": 1}), "pair", "after_generation")
    assert pair("T", ["a"], {}, "gen") == (["a", "gen"], {"p": 1})
    batch = _adapt(lambda t, i, o: {**o, "rows": len(i)}, "batch", "after_generation")
    assert batch("T", ["a", "b"], {}, "gen") == (["a", "b"], {"rows": 2})
    assert _adapt(lambda t, i, o: {**o, "b": 1}, "batch", "append_rows")("T", [], {}) == {"b": 1}
    assert _adapt(lambda t, o: {**o, "o": 1}, "output", "append_rows")("T", [], {}) == {"o": 1}

    def edit(t, o):
        o["edited"] = True

    out = {}
    assert _adapt(edit, "in_place", "after_stages")("T", [], out) is out and out == {"edited": True}
    out = {}
    assert _adapt(edit, "in_place", "after_generation")("T", ["a"], out, "gen") == (["a"], {"edited": True})


def test_training_only_hooks_skip_evaluation(monkeypatch):
    seen = []
    monkeypatch.setitem(HOOKS, "soup", {"after_generation": Hook("soup_glue:mix_prefix_rollouts", "batch")})
    monkeypatch.setattr("trl_groupx.sampling.soup_glue.mix_prefix_rollouts",
                        lambda t, i, o: seen.append("called") or {**o, "mixed": True})
    hooks = GenerationHooks(trl_groupx.get_variant("soup"))
    assert hooks.after_generation("T", [], {}, None, False) == ([], {})  # evaluation: untouched
    assert hooks.after_generation("T", [], {}, None, True) == ([], {"mixed": True}) and seen == ["called"]
    always = Hook("soup_glue:mix_prefix_rollouts", "batch", always=True).resolve("after_generation")
    assert always("T", [], {}, None) == ([], {"mixed": True})


def test_a_hook_at_the_wrong_point_is_refused():
    with pytest.raises(ValueError, match="A 'pair' hook .* cannot run at 'append_rows'"):
        Hook("soup_glue:mix_prefix_rollouts", "pair").resolve("append_rows")
    assert generation_hooks.__doc__ and "append_rows" in generation_hooks.__doc__
