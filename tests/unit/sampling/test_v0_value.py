"""V₀ prompt selection (rollout_filter="v0_value"): selection on hand-built predictions, the context update from
rewards, the built-in knn predictor, the predictor registry and config refusals."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling import v0_value as v0
from trl_groupx.sampling.v0_value import (
    knn_predict,
    prompt_text,
    register_value_predictor,
    select_informative,
    update_context,
    v0_value_select,
)


def _batch(rewards, group_size):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    n = rewards.numel()
    return RolloutBatch(rewards=rewards, completion_lengths=torch.ones(n, dtype=torch.long), group_size=group_size)


def test_select_prefers_largest_variance_and_skips_certain_predictions():
    # p̂ = [0, 0.5, 0.9, 1, 0.3, 0.04]: scores p(1−p) = [0, .25, .09, 0, .21, .0384]; ε = 0.05 skips 0, 1, 0.04
    p = torch.tensor([0.0, 0.5, 0.9, 1.0, 0.3, 0.04])
    assert select_informative(p, 3, 0.05) == ([1, 4, 2], 0)
    # budget 4 > 3 eligible: the 4th comes from the skipped ones, largest score first (0.04 → .0384), counted
    assert select_informative(p, 4, 0.05) == ([1, 4, 2, 5], 1)
    # budget = number of selected prompts; each gets G rollouts, the rest 0: the allocation sums to B·G
    positions, _ = select_informative(p, 2, 0.05)
    allocation = torch.zeros(6, dtype=torch.long)
    allocation[positions] = 4
    assert allocation.sum() == 2 * 4 and allocation[[0, 3, 5]].sum() == 0


def test_select_ties_go_to_the_earlier_candidate():
    # 0.3 and 0.7 share p(1−p) = 0.21; 0.5 ties with itself
    assert select_informative(torch.tensor([0.7, 0.5, 0.3, 0.5]), 3, 0.0) == ([1, 3, 0], 0)
    assert select_informative(torch.tensor([0.2, 0.2, 0.2]), 2, 0.05) == ([0, 1], 0)


def test_select_epsilon_zero_still_skips_exact_zero_and_one():
    assert select_informative(torch.tensor([1.0, 0.0, 0.99]), 1, 0.0) == ([2], 0)
    assert select_informative(torch.tensor([1.0, 0.0]), 2, 0.0) == ([0, 1], 2)  # all skipped: filled in order


@pytest.mark.parametrize("bad", [[0.5, float("nan")], [0.5, 1.2], [-0.1, 0.5]])
def test_select_refuses_predictions_that_are_not_rates(bad):
    with pytest.raises(ValueError, match="success rates in \\[0, 1\\]"):
        select_informative(torch.tensor(bad), 1, 0.05)


def test_select_refuses_a_pool_smaller_than_the_budget():
    with pytest.raises(ValueError, match="v0_value_pool_size"):
        select_informative(torch.tensor([0.5]), 2, 0.05)


def test_context_update_appends_rates_replaces_old_entries_and_truncates():
    index, rate = torch.tensor([3, 1], dtype=torch.int64), torch.tensor([0.25, 1.0], dtype=torch.float64)
    # batch: prompt 1 (2/4), prompt 5 (NaN only: no entry), prompt 0 (1/3)
    index, rate = update_context(index, rate, torch.tensor([1, 5, 0]), torch.tensor([2, 0, 1]),
                                 torch.tensor([4, 0, 3]), size=10)
    assert index.tolist() == [3, 1, 0]  # prompt 1's old entry dropped, the new one appended
    torch.testing.assert_close(rate, torch.tensor([0.25, 0.5, 1 / 3], dtype=torch.float64))
    index, rate = update_context(index, rate, torch.tensor([7]), torch.tensor([4]), torch.tensor([4]), size=2)
    assert index.tolist() == [0, 7] and rate.tolist() == [pytest.approx(1 / 3), 1.0]


def test_rollout_filter_folds_global_rewards_into_the_context_nan_excluded():
    state = {"pending": torch.tensor([4, 2])}
    nan = float("nan")
    # group 0 (prompt 4): rewards 1, 0, NaN, 1 → 2 successes of 3 scored; group 1 (prompt 2): all NaN → nothing
    keep = v0.v0_value(_batch([1, 0, nan, 1, nan, nan, nan, nan], 4), v0_value_success_threshold=1.0,
                       v0_value_context_size=256, state=state)
    assert keep.all() and keep.shape == (8,)
    assert state["context_index"].tolist() == [4]
    assert state["context_rate"].tolist() == [pytest.approx(2 / 3)]
    assert state["pending"].numel() == 0


def test_rollout_filter_threshold_and_group_size_one_and_two():
    state = {"pending": torch.tensor([0, 1, 2])}
    # G = 2, threshold 0.5: [0.5, 0.4] → 1/2, [0, 0] → 0, [1, 2] → 1
    v0.v0_value(_batch([0.5, 0.4, 0, 0, 1, 2], 2), v0_value_success_threshold=0.5, v0_value_context_size=8,
                state=state)
    assert state["context_rate"].tolist() == [0.5, 0.0, 1.0]
    state = {"pending": torch.tensor([6])}
    v0.v0_value(_batch([1.0], 1), v0_value_success_threshold=1.0, v0_value_context_size=8, state=state)
    assert state["context_index"].tolist() == [6] and state["context_rate"].tolist() == [1.0]


def test_rollout_filter_without_pending_changes_nothing_and_refuses_inf():
    state = {}
    assert v0.v0_value(_batch([1, 0], 2), state=state).all() and state == {}
    with pytest.raises(ValueError, match="infinite"):
        v0.v0_value(_batch([1, math.inf], 2), state={"pending": torch.tensor([0])})
    with pytest.raises(ValueError, match="3 rollouts for 2 selected"):
        v0.v0_value(_batch([1, 0, 1], 3), state={"pending": torch.tensor([0, 1])})


def test_knn_predict_by_hand():
    # target "a b" vs context "a b" (J = 1, rate 0) and "a c" (J = 1/3, rate 1): p̂ = (1·0 + 1/3·1) / (4/3) = 0.25
    assert knn_predict(["a b", "a c"], [0.0, 1.0], ["a b"]) == [pytest.approx(0.25)]
    assert knn_predict([], [], ["x"]) == [0.5] and knn_predict(["y"], [1.0], ["x"]) == [0.5]  # nothing shared


def test_prompt_text_plain_and_conversational():
    assert prompt_text("hi") == "hi"
    assert prompt_text([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "s\nq"


@pytest.fixture
def predictors(monkeypatch):
    """Registrations made by a test go into a copy of the registry."""
    monkeypatch.setattr(v0, "_PREDICTORS", dict(v0._PREDICTORS))


def test_selection_uses_the_registered_predictor_with_the_state_context(predictors):
    calls = []

    class Model:  # the official V0.predict signature
        def predict(self, context_prompts, context_labels, target_prompts):
            calls.append((context_prompts, context_labels, target_prompts))
            return [0.0, 0.3, 0.5, 1.0, 0.6]

    register_value_predictor("test_model", Model())
    trainer = SimpleNamespace(train_dataset=[{"prompt": f"q{i}"} for i in range(5)])
    state = {"context_index": torch.tensor([3]), "context_rate": torch.tensor([1.0], dtype=torch.float64),
             "draws": 0, "skipped": 0}
    picked = v0_value_select(state, 2, 5, trainer, seed=0, v0_value_predictor="test_model", v0_value_epsilon=0.05,
                             v0_value_pool_size=0)
    assert picked == [2, 4]  # 0.5 (.25) then 0.6 (.24); 0 and 1 never chosen
    assert calls == [(["q3"], [1.0], ["q0", "q1", "q2", "q3", "q4"])]
    assert state["draws"] == 1 and state["skipped"] == 0


def test_selection_pool_is_seeded_by_the_draw_counter(predictors):
    register_value_predictor("half", lambda cp, cl, tp: [0.5] * len(tp))
    trainer = SimpleNamespace(train_dataset=[{"prompt": f"q{i}"} for i in range(10)])
    kwargs = dict(seed=3, v0_value_predictor="half", v0_value_epsilon=0.05, v0_value_pool_size=4)
    first = v0_value_select({}, 2, 10, trainer, **kwargs)
    again = v0_value_select({}, 2, 10, trainer, **kwargs)
    second = v0_value_select({"draws": 1, "context_index": torch.zeros(0, dtype=torch.long),
                              "context_rate": torch.zeros(0, dtype=torch.float64)}, 2, 10, trainer, **kwargs)
    assert first == again == np.random.default_rng([3, 0]).permutation(10)[:2].tolist()  # all tie: pool order
    assert second == np.random.default_rng([3, 1]).permutation(10)[:2].tolist() != first


def _config(**overrides):
    values = dict(v0_value_predictor="knn", v0_value_epsilon=0.05, v0_value_context_size=256, v0_value_pool_size=0,
                  v0_value_success_threshold=1.0)
    return SimpleNamespace(**{**values, **overrides})


@pytest.mark.parametrize("field, value, match", [
    ("v0_value_predictor", "missing", "register_value_predictor"),
    ("v0_value_predictor", None, "v0_value_predictor"),
    ("v0_value_epsilon", 0.5, "v0_value_epsilon"),
    ("v0_value_epsilon", -0.1, "v0_value_epsilon"),
    ("v0_value_context_size", 0, "v0_value_context_size"),
    ("v0_value_pool_size", -1, "v0_value_pool_size"),
    ("v0_value_pool_size", True, "v0_value_pool_size"),
    ("v0_value_success_threshold", float("nan"), "v0_value_success_threshold"),
])
def test_validate_names_the_flag_and_the_fix(field, value, match):
    v0._validate(_config())
    with pytest.raises(ValueError, match=match):
        v0._validate(_config(**{field: value}))


def test_register_refuses_a_non_predictor(predictors):
    with pytest.raises(ValueError, match="predict"):
        register_value_predictor("bad", 3)
