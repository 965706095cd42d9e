"""Step-credit helpers (per-step data model, returns, grouped statistics, token layout) and the counter-game toy
environment, with the step credit of a scripted batch derived by hand."""

import inspect

import pytest
import torch

from trl_groupx.advantages.agentflow import agentflow_step_advantages
from trl_groupx.advantages.gigpo import gigpo_step_advantages
from trl_groupx.advantages.hgpo import hgpo_step_advantages
from trl_groupx.advantages.step_credit import (
    StepBatch,
    discounted_returns,
    segment_normalize,
    state_key,
    step_rank,
    step_to_token_advantages,
    turn_index_from_tool_mask,
)
from trl_groupx.toy.counter_game import CounterGame, play

NAN = float("nan")


def test_state_key_is_stable_and_exact():
    assert state_key("counter=2") == state_key("counter=2")
    assert state_key("counter=2") != state_key("counter=3")
    assert state_key({"b": 1, "a": [1, 2]}) == state_key({"a": (1, 2), "b": 1})
    assert state_key(torch.tensor([1, 2])) == state_key(torch.tensor([1, 2]))
    assert 0 <= state_key("x") < 2 ** 63
    # pinned: BLAKE2b, not the salted hash(), so the same on every process and run
    assert state_key("counter=2") == 0x6e4243e6806c35d0


def test_step_rank_orders_by_index_with_gaps_and_shuffles():
    steps = StepBatch(torch.tensor([1, 0, 1, 0, 1]), torch.tensor([7, 5, 2, 0, 4]), torch.zeros(5, dtype=torch.long),
                      torch.zeros(5))
    assert step_rank(steps).tolist() == [2, 1, 0, 0, 1]


def test_discounted_returns_by_hand_and_nan():
    # rewards [1, 0, 2], γ = .5: G2 = 2, G1 = 0 + .5·2 = 1, G0 = 1 + .5·1 = 1.5;  second episode [3] → 3
    steps = StepBatch.from_lists([["a", "b", "c"], ["d"]], [[1, 0, 2], [3]])
    torch.testing.assert_close(discounted_returns(steps, 2, 0.5), torch.tensor([1.5, 1.0, 2.0, 3.0]))
    steps = StepBatch.from_lists([["a", "b", "c"]], [[1, NAN, 2]])
    r = discounted_returns(steps, 1, 0.5)
    assert torch.isnan(r[:2]).all() and r[2] == 2.0


def test_segment_normalize_unbiased_population_weights():
    v = torch.tensor([1.0, 0.0, 5.0, 2.0])
    seg = torch.tensor([0, 0, 1, 9])
    valid = torch.tensor([True, True, True, True])
    out, wsum = segment_normalize(v, seg, valid, unbiased=False, eps=0.0)
    torch.testing.assert_close(out, torch.tensor([1.0, -1.0, 0.0, 0.0]))  # pop std .5; singletons → 0
    assert wsum.tolist() == [2, 2, 1, 1]
    out, _ = segment_normalize(v, seg, valid, unbiased=True, eps=0.0)
    torch.testing.assert_close(out, torch.tensor([2 ** 0.5 / 2 * 1, -(2 ** 0.5) / 2, 0.0, 0.0]))
    # weights: value 1 counted 3 times, 0 once → mean .75, dev .25 / −.75
    out, _ = segment_normalize(v[:2], seg[:2], valid[:2], weights=torch.tensor([3.0, 1.0]), scale=False)
    torch.testing.assert_close(out, torch.tensor([0.25, -0.75]))
    # padding / invalid entries are never read
    out, _ = segment_normalize(torch.tensor([1.0, NAN, 0.0]), torch.tensor([0, 0, 0]),
                               torch.tensor([True, False, True]), scale=False)
    torch.testing.assert_close(out, torch.tensor([0.5, 0.0, -0.5]))


def test_turn_index_from_tool_mask_matches_trl_layout():
    # TRL _tool_call_loop: [turn 0][tool result][turn 1][tool result][turn 2], right padding (completion_mask 0)
    tool = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
    comp = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
    t = turn_index_from_tool_mask(tool, comp)
    assert t.tolist() == [[0, 0, -1, -1, 1, 1, 1, -1, 2, -1], [0, 0, 0, -1, -1, -1, -1, -1, -1, -1]]


def test_step_to_token_advantages_with_fallback():
    steps = StepBatch.from_lists([["a", "b"], ["c"]])
    step_adv = torch.tensor([0.3, -0.2, 0.7])
    turns = torch.tensor([[0, 0, -1, 1, -1, 2], [0, -1, 1, 1, -1, -1]])
    tok = step_to_token_advantages(step_adv, steps, turns, fallback=torch.tensor([9.0, 5.0]))
    # episode 0: turn 2 has no step record → fallback 9;  episode 1: turn 1 unrecorded → fallback 5
    torch.testing.assert_close(tok, torch.tensor([[0.3, 0.3, 0, -0.2, 0, 9.0], [0.7, 0, 5.0, 5.0, 0, 0]]))
    tok0 = step_to_token_advantages(step_adv, steps, turns)
    assert tok0[0, 5] == 0 and tok0[1, 2] == 0


def test_counter_game_follows_trl_environment_protocol():
    env = CounterGame()
    assert env.reset() == "counter=0"
    # TRL exposes every public method but reset/get_reward as a tool (grpo_trainer.py, _generate_and_score_completions)
    tools = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert tools == ["add"]
    from transformers.utils import get_json_schema

    assert get_json_schema(env.add)["function"]["parameters"]["required"] == ["amount"]
    assert env.add(2) == "counter=2"
    assert env.add(1) == "counter=3 (game over)"
    assert env.get_reward() == 1.0
    with pytest.raises(ValueError, match="over"):
        env.add(1)
    assert env._step_structure() == (["counter=0", "counter=2", "counter=3"], [0.0, 1.0, 0.0])


def scripted_batch():
    # G = 4 episodes of the counter game (target 3, ≤ 3 moves); one step per model turn (tool calls + final answer)
    games = [play([1, 2]), play([2, 1]), play([2, 2]), play([1, 1, 2])]
    states = [g[0] for g in games]
    rewards = [g[1] for g in games]
    outcomes = torch.tensor([g[2] for g in games])
    return StepBatch.from_lists(states, rewards), states, rewards, outcomes


def test_scripted_counter_game_by_hand():
    _, states, rewards, outcomes = scripted_batch()
    assert states == [["counter=0", "counter=1", "counter=3"], ["counter=0", "counter=2", "counter=3"],
                      ["counter=0", "counter=2", "counter=4"], ["counter=0", "counter=1", "counter=2", "counter=4"]]
    assert rewards == [[0, 1, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0, 0]]
    assert outcomes.tolist() == [1, 1, 0, 0]


def test_counter_game_gigpo_credit_by_hand():
    steps, *_, outcomes = scripted_batch()
    # γ = 1, mean_norm.  Episode level: outcomes [1, 1, 0, 0] → ±.5.
    # Returns: ep0 [1, 1, 0], ep1 [1, 1, 0], ep2 [0, 0, 0], ep3 [0, 0, 0, 0].  Anchor states:
    #   counter=0: {1, 1, 0, 0} → ±.5          counter=1: {ep0 t1: 1, ep3 t1: 0} → ±.5
    #   counter=2: {ep1 t1: 1, ep2 t1: 0, ep3 t2: 0}, mean 1/3 → +2/3, −1/3, −1/3  (add 1 wins, add 2 overshoots)
    #   counter=3: {0, 0} → 0                   counter=4: {0, 0} → 0
    a = gigpo_step_advantages(outcomes, 4, steps, gigpo_gamma=1.0, gigpo_mode="mean_norm")
    expected = [1, 1, 0.5, 1, 0.5 + 2 / 3, 0.5, -1, -0.5 - 1 / 3, -0.5, -1, -1, -0.5 - 1 / 3, -0.5]
    torch.testing.assert_close(a, torch.tensor(expected, dtype=torch.float32))
    # Flow-GRPO ignores states: the outcome advantage on every turn
    f = agentflow_step_advantages(outcomes, 4, steps, agentflow_scale=False)
    torch.testing.assert_close(f, torch.tensor([0.5] * 6 + [-0.5] * 7))


def test_counter_game_hgpo_credit_by_hand():
    steps, *_, outcomes = scripted_batch()
    # γ = 1, mean_norm, history 1 (levels k = 1, 2 with weights 2, 3).  Level 1 as in GiGPO's step part above.
    # Level 2 (previous, current) groups of ≥ 2: (0, 1) = {ep0 t1: 1, ep3 t1: 0} → ±.5;
    #   (0, 2) = {ep1 t1: 1, ep2 t1: 0} → ±.5;  all others singletons or all-zero (dropped).
    #   ep0: t0 .5·2/2, t1 (2·.5 + 3·.5)/5 = .5, t2 0;   ep1: t0 .5, t1 (2·2/3 + 3·.5)/5 = 17/30, t2 0
    #   ep2: t0 −.5, t1 (2·−1/3 + 3·−.5)/5 = −13/30, t2 0;  ep3: t0 −.5, t1 −.5, t2 level 1 only: −1/3, t3 0
    a = hgpo_step_advantages(outcomes, 4, steps, hgpo_gamma=1.0, hgpo_history_length=1, hgpo_mode="mean_norm")
    expected = [0.5, 0.5, 0, 0.5, 17 / 30, 0, -0.5, -13 / 30, 0, -0.5, -0.5, -1 / 3, 0]
    torch.testing.assert_close(a, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=1e-5)
