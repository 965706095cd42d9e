"""dagger: graded 0 / 0.5 / 1 / 2 reward over a restricted graph interpreter."""

import json

import pytest

from trl_groupx.rewards import GraphError, executable_graph_reward, execute_graph
from trl_groupx.rewards.dagger import graph_format_ok, parse_graph


def fenced(nodes):
    return "```json\n" + json.dumps({"nodes": nodes}) + "\n```"


# 12 apples, 5 eaten, 3 pears (a distractor): 12 − 5 = 7
GOOD = [
    {"id": "apples", "op": "const", "val": 12},
    {"id": "eaten", "op": "const", "val": 5},
    {"id": "pears", "op": "const", "val": 3, "distractor": True},
    {"id": "final_result", "op": "sub", "args": ["apples", "eaten"]},
]


def test_grades():
    not_exec = [dict(n) for n in GOOD[:3]] + [{"id": "final_result", "op": "div", "args": ["apples", 0]}]
    comps = [fenced(GOOD), fenced(GOOD), fenced(not_exec), "The answer is 7.", fenced(GOOD[:1] + GOOD[3:])]
    # correct → 0.5 + 0.5 + 1 = 2 ; wrong gold → 1 ; division by zero → 0.5 ; no graph → 0 ; only 2 nodes → 0
    assert executable_graph_reward(completions=comps, solution=["7", "8", "7", "7", "7"]) == [2.0, 1.0, 0.5, 0.0, 0.0]


def test_edges():
    out = executable_graph_reward(
        completions=["", [{"role": "assistant", "content": fenced(GOOD)}], fenced(GOOD), fenced(GOOD)],
        solution=["7", "৭", None, "not a number"],
    )
    # empty → 0 ; Bangla digit gold ৭ = 7 → 2 ; None gold → executes only, 1 ; unparseable gold → 1
    assert out == [0.0, 2.0, 1.0, 1.0]
    two_finals = GOOD + [{"id": "final_result", "op": "const", "val": 1}]
    assert not graph_format_ok(fenced(two_finals))
    assert not graph_format_ok("```json\n{not json}\n```") and not graph_format_ok("```json```")
    assert parse_graph("text {\"nodes\": []} more") == {"nodes": []}
    assert parse_graph("[1, 2]") is None


def test_ops_and_aliases():
    nodes = [
        {"id": "a", "op": "Constant", "val": "1,200"},
        {"id": "b", "op": "value", "val": 4},
        {"id": "c", "op": "power", "args": ["b", 2]},      # 16
        {"id": "d", "op": "avg", "args": ["a", "c", 4]},   # (1200 + 16 + 4)/3
        {"id": "e", "op": "lcm", "args": [4, 6]},          # 12
        {"id": "final_result", "op": "add", "args": ["d", "e", "pass_through"]},
        {"id": "pass_through", "op": "identity", "args": [0.5]},
    ]
    assert execute_graph({"nodes": nodes}) == pytest.approx(1220 / 3 + 12 + 0.5)


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([{"id": "final_result", "op": "add", "args": ["x", "final_result"]}, {"id": "x", "op": "const", "val": 1}],
         "cycle"),
        ([{"id": "final_result", "op": "pow", "args": [10, 1000]}], "exponent"),
        ([{"id": "final_result", "op": "mul", "args": [1e10, 1e10]}], "outside"),
        ([{"id": "final_result", "op": "gcd", "args": [1e13, 2]}], "integer operand"),
        ([{"id": "final_result", "op": "__import__", "args": ["os"]}], "unknown op"),
        ([{"id": "final_result", "op": "sqrt", "args": [-1]}], "negative"),
        ([{"id": "final_result", "op": "sub", "args": [1]}], "args"),
        ([{"id": "final_result", "op": "add", "args": ["nope", 1]}], "not a number"),
        ([{"id": "x", "op": "const", "val": 1}], "final_result"),
        ([], "no nodes"),
    ],
)
def test_limits_raise(nodes, message):
    with pytest.raises(GraphError, match=message):
        execute_graph({"nodes": nodes})


def test_node_limit_and_deep_chain_without_recursion():
    chain = [{"id": "n0", "op": "const", "val": 1}] + [
        {"id": f"n{i}", "op": "add", "args": [f"n{i - 1}", 1]} for i in range(1, 5000)
    ] + [{"id": "final_result", "op": "identity", "args": ["n4999"]}]
    assert execute_graph({"nodes": chain}, max_nodes=10_000) == 5000.0  # explicit stack: no RecursionError
    with pytest.raises(GraphError, match="max_nodes"):
        execute_graph({"nodes": chain})
