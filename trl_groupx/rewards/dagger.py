"""DAGGER executable computation-graph reward, evaluated by a restricted, limit-checked interpreter (no exec/eval)."""

from __future__ import annotations

import json
import math
from typing import Any

from ._utils import column, completion_text

__all__ = [
    "ExecutableGraphReward",
    "GraphError",
    "executable_graph_reward",
    "execute_graph",
    "graph_format_ok",
    "parse_graph",
]

_OPS = {  # alias → canonical op (the official op vocabulary, see ExecutableGraphReward)
    **dict.fromkeys(("const", "constant", "value"), "const"),
    **dict.fromkeys(("add", "addition", "plus"), "add"), "sum": "sum",
    **dict.fromkeys(("sub", "subtract", "minus", "subtraction"), "sub"),
    **dict.fromkeys(("mul", "multiply", "mult", "product", "times"), "mul"),
    **dict.fromkeys(("div", "divide", "division"), "div"),
    **dict.fromkeys(("mean", "average", "avg"), "mean"),
    **dict.fromkeys(("min", "minimum"), "min"), **dict.fromkeys(("max", "maximum"), "max"),
    **dict.fromkeys(("sqrt", "square_root"), "sqrt"), **dict.fromkeys(("pow", "power", "exponent"), "pow"),
    **dict.fromkeys(("round", "rounding"), "round"), "floor": "floor", **dict.fromkeys(("ceil", "ceiling"), "ceil"),
    **dict.fromkeys(("abs", "absolute"), "abs"), **dict.fromkeys(("mod", "modulo", "remainder"), "mod"),
    "gcd": "gcd", "lcm": "lcm", **dict.fromkeys(("identity", "id", "pass"), "identity"),
}
_BN_DIGITS = str.maketrans("০১২৩৪৫৬৭৮৯", "0123456789")


class GraphError(ValueError):
    """The graph is malformed or does not execute within the limits."""


def parse_graph(text: str) -> dict | None:
    """The JSON object of a completion: the whole text, else the first fenced block, else the outermost ``{…}``.
    ``json.loads`` only (data, never code); ``None`` if nothing parses to an object."""
    candidates = [text]
    if "```" in text:
        start = text.find("```") + 3
        block = text[start:text.find("```", start)] if text.find("```", start) != -1 else text[start:]
        candidates.append(block.removeprefix("json"))
    if "{" in text and "}" in text:
        candidates.append(text[text.find("{"):text.rfind("}") + 1])
    for candidate in candidates:
        try:
            data = json.loads(candidate.strip())
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(data, dict):
            return data
    return None


def graph_format_ok(text: str, *, min_nodes: int = 3) -> bool:
    """The official format rule: the completion is one fenced ```json block holding ``{"nodes": [...]}`` with at
    least ``min_nodes`` dict nodes and exactly one node whose id is ``final_result``."""
    text = text.strip()
    if not (text.startswith("```json") and text.endswith("```") and len(text) >= 10):
        return False
    try:
        data = json.loads(text[len("```json"):-3].strip())
    except (json.JSONDecodeError, RecursionError):
        return False
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or len(nodes) < min_nodes or not all(isinstance(n, dict) for n in nodes):
        return False
    return sum(1 for n in nodes if n.get("id") == "final_result") == 1


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise GraphError("booleans are not numbers")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().translate(_BN_DIGITS).replace(",", ""))
        except ValueError:
            raise GraphError(f"not a number or node id: {value!r}") from None
    raise GraphError(f"not a number or node id: {value!r}")


def execute_graph(graph: dict, *, max_nodes: int = 256, max_abs: float = 1e15, max_exponent: float = 64.0,
                  max_int: int = 10**12) -> float:
    """Value of the ``final_result`` node of a ``{"nodes": [{"id", "op", "args" | "val", "distractor"?}]}`` graph.

    A restricted interpreter: a fixed table of arithmetic ops on floats, no names, no attribute access, no code.
    Limits (each a ``GraphError``): at most ``max_nodes`` nodes; every intermediate value finite with magnitude
    ≤ ``max_abs``; ``pow`` exponents within ±``max_exponent``; ``gcd``/``lcm``/``mod`` on integers ≤ ``max_int``;
    cycles, unknown ids or ops, wrong arities, division or modulo by zero, sqrt of a negative. Evaluation is an
    explicit stack (no Python recursion), each node computed once.
    """
    raw = graph.get("nodes") if isinstance(graph, dict) else None
    if not isinstance(raw, list) or not raw:
        raise GraphError("no nodes")
    if len(raw) > max_nodes:
        raise GraphError(f"{len(raw)} nodes > max_nodes={max_nodes}")
    nodes: dict[str, dict] = {}
    for node in raw:
        if not isinstance(node, dict) or not isinstance(node.get("id"), (str, int)) or isinstance(node["id"], bool):
            raise GraphError(f"bad node {node!r:.80}")
        nodes[str(node["id"])] = node
    if "final_result" not in nodes:
        raise GraphError("no final_result node")

    values: dict[str, float] = {}

    def check(x: float) -> float:
        if not math.isfinite(x) or abs(x) > max_abs:
            raise GraphError(f"value {x!r} outside ±{max_abs:g}")
        return x

    def args_of(node: dict) -> list[Any]:
        args = node.get("args", [])
        if not isinstance(args, list):
            raise GraphError("args must be a list")
        return args

    def deps(node: dict) -> list[str]:
        return [str(a) for a in args_of(node) if isinstance(a, (str, int)) and not isinstance(a, bool)
                and str(a) in nodes]

    def resolve(arg: Any) -> float:
        if isinstance(arg, (str, int)) and not isinstance(arg, bool) and str(arg) in nodes:
            return values[str(arg)]
        return check(_number(arg))

    def integer(x: float) -> int:
        if abs(x) > max_int:
            raise GraphError(f"integer operand {x!r} > {max_int}")
        return int(x)

    def compute(node_id: str, node: dict) -> float:
        op = _OPS.get(str(node.get("op", "")).lower().strip())
        if op is None:
            raise GraphError(f"unknown op {node.get('op')!r} in node {node_id!r}")
        if op == "const":
            if "val" not in node:
                raise GraphError(f"const node {node_id!r} has no val")
            return check(_number(node["val"]))
        a = [resolve(x) for x in args_of(node)]

        def arity(lo: int, hi: int | None = None) -> None:
            if len(a) < lo or (hi is not None and len(a) > hi):
                raise GraphError(f"op {op!r} in node {node_id!r} got {len(a)} args")

        if op == "identity":
            arity(1)
            return a[0]
        if op == "add":
            arity(2)
            return check(math.fsum(a))
        if op in ("sum", "mean", "min", "max"):
            arity(1)
            return check({"sum": math.fsum(a), "mean": math.fsum(a) / len(a), "min": min(a), "max": max(a)}[op])
        if op == "sub":
            arity(2, 2)
            return check(a[0] - a[1])
        if op == "mul":
            arity(2)
            out = 1.0
            for x in a:
                out = check(out * x)
            return out
        if op in ("div", "mod"):
            arity(2, 2)
            if a[1] == 0:
                raise GraphError(f"{op} by zero in node {node_id!r}")
            return check(a[0] / a[1]) if op == "div" else check(float(a[0] % a[1]))
        if op == "sqrt":
            arity(1, 1)
            if a[0] < 0:
                raise GraphError(f"sqrt of a negative number in node {node_id!r}")
            return math.sqrt(a[0])
        if op == "pow":
            arity(2, 2)
            if abs(a[1]) > max_exponent:
                raise GraphError(f"exponent {a[1]!r} > {max_exponent}")
            if a[0] == 0 and a[1] < 0:
                raise GraphError("0 to a negative power")
            try:
                result = a[0] ** a[1]
            except OverflowError:
                raise GraphError("pow overflow") from None
            if isinstance(result, complex):
                raise GraphError("complex result")
            return check(float(result))
        if op in ("round", "floor", "ceil"):
            arity(1, 1)
            return check(float({"round": round, "floor": math.floor, "ceil": math.ceil}[op](a[0])))
        if op == "abs":
            arity(1, 2)
            return abs(a[0]) if len(a) == 1 else check(abs(a[0] - a[1]))
        if op in ("gcd", "lcm"):
            arity(2)
            ints = [integer(x) for x in a]
            out = ints[0]
            for v in ints[1:]:
                out = math.gcd(out, v) if op == "gcd" else (abs(out * v) // math.gcd(out, v) if out and v else 0)
                if abs(out) > max_int:
                    raise GraphError(f"lcm {out} > {max_int}")
            return float(out)
        raise GraphError(f"unhandled op {op!r}")  # pragma: no cover - _OPS and the branches above agree

    # iterative post-order evaluation from final_result, with cycle detection
    stack: list[tuple[str, bool]] = [("final_result", False)]
    on_path: set[str] = set()
    while stack:
        node_id, expanded = stack.pop()
        if node_id in values:
            continue
        if expanded:
            on_path.discard(node_id)
            values[node_id] = compute(node_id, nodes[node_id])
            continue
        if node_id in on_path:
            raise GraphError(f"cycle through node {node_id!r}")
        on_path.add(node_id)
        stack.append((node_id, True))
        for dep in deps(nodes[node_id]):
            if dep in on_path:
                raise GraphError(f"cycle through node {dep!r}")
            if dep not in values:
                stack.append((dep, False))
    return values["final_result"]


def _close(gold: Any, value: float) -> bool:
    try:
        return math.isclose(_number(gold), value, rel_tol=1e-6)
    except GraphError:
        return False


class ExecutableGraphReward:
    """DAGGER reward ("DAGGER: Distractor-Aware Graph Generation for Executable Reasoning in Math
    Problems", arXiv:2601.06853; catalog id ``dagger``): the completion is a computational graph (JSON nodes with
    ops and explicit distractor nodes), executed, and graded

        r = 0     malformed (not one fenced ```json block with ≥ 3 nodes and exactly one ``final_result`` node)
        r = 0.5   well-formed but does not execute
        r = 1.0   executes
        r = 2.0   executes to the gold answer (relative tolerance 1e-6)

    Official code: dipta007/DAGGER@3173f86f55e4ba14f9b15a9f4e1b5b49988be007:src/train/grpo/grpo_rewards.py:
    response_one_reward_rules_all l.390-413 (grading), correct_format l.340-358 (format rule),
    execute_graph_from_data l.131-331 and _OP_MAP l.6-53 (op vocabulary), is_correct l.361-387 (Bangla digits,
    ``math.isclose``). Our differences, for safety: the graph is evaluated by our own restricted interpreter
    (:func:`execute_graph`: ``json.loads`` + a fixed op table, explicit stack, limits on node count, magnitude,
    exponents and integer size) rather than the official recursive evaluator, and always from the
    ``final_result`` node (the format rule requires it, so the official fallback search for a result node never
    changes a graded reward). ``None`` gold: the correctness bonus is skipped (max 1.0).

    Dataset column: ``solution``: the gold number (Latin or Bangla digits).
    """

    __name__ = "executable_graph_reward"

    def __init__(self, *, min_nodes: int = 3, max_nodes: int = 256):
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes

    def score(self, text: str, gold: Any) -> float:
        if not graph_format_ok(text, min_nodes=self.min_nodes):
            return 0.0
        graph = parse_graph(text)
        if graph is None:
            return 0.0
        reward = 0.5
        try:
            value = execute_graph(graph, max_nodes=self.max_nodes)
        except GraphError:
            return reward
        reward += 0.5
        if gold is not None and _close(gold, value):
            reward += 1.0
        return reward

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float]:
        texts = [completion_text(c) for c in (completions or [])]
        golds = column(kwargs, "solution", len(texts))
        return [self.score(t, g) for t, g in zip(texts, golds, strict=True)]


executable_graph_reward = ExecutableGraphReward()
