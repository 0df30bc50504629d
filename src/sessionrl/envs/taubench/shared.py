"""The tools every τ-bench domain offers besides its own: `calculate`, `think` and
`transfer_to_human_agents`. A domain includes them in its `tools` and their error meanings in its `errors`:

```python
class AirlineEnv(TauEnv):
    tools = (*SHARED_TOOLS, book_reservation, cancel_reservation)
    errors: ClassVar[dict[str, str]] = {**SHARED_ERRORS, "NOT_FOUND": "No such reservation."}
```

A domain's `tools.json` may describe them (τ-bench's files do); where it does not, `SHARED_SCHEMAS` does.
Their contract examples come from `SHARED_EXAMPLES` unless the domain's `examples()` gives its own.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any, Final

from sessionrl.envs.taubench.data import TauDb
from sessionrl.envs.taubench.tools import Json, Tool, tool
from sessionrl.skills import SkillError

INVALID_ARGUMENT: Final = "INVALID_ARGUMENT"
SHARED_ERRORS: Final[dict[str, str]] = {INVALID_ARGUMENT: "A parameter breaks a rule of the domain policy."}
"""The meaning of every code the shared tools raise (`calculate`: a malformed expression)."""

_CALC_CHARS: Final = frozenset("0123456789+-*/(). ")
_BIN_OPS: Final[dict[type[ast.operator], Callable[[float, float], float]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_ONLY_ARITHMETIC: Final = "only numbers, + - * / and parentheses are allowed"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        return _BIN_OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise SkillError(INVALID_ARGUMENT, _ONLY_ARITHMETIC)


@tool(errors=(INVALID_ARGUMENT,))
def calculate(db: TauDb, expression: str) -> Json:
    """The value of an arithmetic expression (digits, `+-*/()`, `.` and spaces), rounded to 2 decimals."""
    if not expression.strip() or not set(expression) <= _CALC_CHARS:
        raise SkillError(INVALID_ARGUMENT, _ONLY_ARITHMETIC)
    try:
        value = _evaluate(ast.parse(expression, mode="eval"))
    except SyntaxError as error:
        raise SkillError(INVALID_ARGUMENT, f"malformed expression: {error.msg}") from None
    except ZeroDivisionError:
        raise SkillError(INVALID_ARGUMENT, "division by zero") from None
    return {"result": round(value, 2)}


@tool()
def think(db: TauDb, thought: str) -> Json:
    """Nothing: a place for the agent to write down its reasoning."""
    return {}


@tool(ends_episode=True)
def transfer_to_human_agents(db: TauDb, summary: str) -> Json:
    """Hand the user over to a human; the episode ends."""
    return {"transferred": True}


SHARED_TOOLS: Final[tuple[Tool[...], ...]] = (calculate, think, transfer_to_human_agents)
"""The shared tools, for a domain's `tools`."""

SHARED_EXAMPLES: Final[dict[str, list[Json]]] = {
    "calculate": [{"expression": "(1 + 2) * 3.5"}],
    "think": [{"thought": "the policy asks for the user's id before any change"}],
    "transfer_to_human_agents": [{"summary": "the user asks for a person"}],
}
"""One valid call of each shared tool, used for its contract unless the domain gives its own."""


def _schema(name: str, description: str, parameter: str, meaning: str) -> dict[str, Any]:
    properties = {parameter: {"type": "string", "description": meaning}}
    parameters = {"type": "object", "properties": properties, "required": [parameter]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


SHARED_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "calculate": _schema(
        "calculate",
        "Work out an arithmetic expression; the result is rounded to two decimals.",
        "expression",
        "Numbers with + - * / and parentheses, such as '(12.5 + 3) * 2'.",
    ),
    "think": _schema(
        "think",
        "Write down a thought; nothing in the database changes. Use it to reason before acting.",
        "thought",
        "The thought.",
    ),
    "transfer_to_human_agents": _schema(
        "transfer_to_human_agents",
        "Hand the user over to a human agent, when the policy says so or the user asks; the conversation "
        "ends.",
        "summary",
        "What the user wants and what was done so far.",
    ),
}
"""The OpenAI function schema of each shared tool, for a `tools.json` that does not describe it."""
