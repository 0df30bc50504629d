"""A τ-bench domain's tools: plain functions over one episode's `TauDb`, marked with what a contract needs.

```python
@tool(errors=("NOT_FOUND",), writes=True)
def cancel_order(db: TauDb, order_id: str) -> Json:
    ...
```

A tool is called with the episode's database and the call's parameters as keywords, and returns any JSON
value (an object, an array, a string, as τ-bench's own tools do). A failure raises `SkillError` with one of
the tool's declared `errors` codes (final: asking again gives the same answer) and changes nothing. The
function's name is the tool's name in `tools.json`; `writes` marks tools that change the database (high
risk), `ends_episode` those that end it (a hand-off).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec

from sessionrl.envs.taubench.data import TauDb
from sessionrl.skills import SkillError
from sessionrl.skills.skill import JsonValue

Json = dict[str, Any]
"""A JSON object (what most tools return)."""
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Tool(Generic[P]):
    """A domain function with the facts its contract needs. Calling it calls the function."""

    fn: Callable[Concatenate[TauDb, P], JsonValue]
    errors: tuple[str, ...] = ()
    """The domain error codes the tool may raise (each needs a meaning in the environment's `errors`)."""
    writes: bool = False
    """Whether the tool may change the database; such tools are high-risk skills."""
    ends_episode: bool = False
    """Whether a call ends the episode (a hand-off to a human agent)."""

    @property
    def name(self) -> str:
        """The tool's name: its function's name."""
        return self.fn.__name__

    def __call__(self, db: TauDb, /, *args: P.args, **kwargs: P.kwargs) -> JsonValue:
        return self.fn(db, *args, **kwargs)


def tool(
    *, errors: Sequence[str] = (), writes: bool = False, ends_episode: bool = False
) -> Callable[[Callable[Concatenate[TauDb, P], JsonValue]], Tool[P]]:
    """Mark a function as a domain tool (see `Tool`)."""

    def mark(fn: Callable[Concatenate[TauDb, P], JsonValue]) -> Tool[P]:
        return Tool(fn, tuple(errors), writes, ends_episode)

    return mark


def toolbox(tools: Sequence[Tool[...]]) -> dict[str, Tool[...]]:
    """Tools by name; raises `ValueError` when two share a name."""
    by_name: dict[str, Tool[...]] = {}
    for each in tools:
        if each.name in by_name:
            raise ValueError(f"two tools are named {each.name!r}; give each function its own name")
        by_name[each.name] = each
    return by_name


def apply_actions(db: TauDb, tools: Mapping[str, Tool[...]], actions: Sequence[Mapping[str, Any]]) -> int:
    """Run `{name, kwargs}` actions on `db` in order, as the benchmark does; returns how many failed.

    A failed action (`SkillError`) changes nothing and the next one still runs.
    """
    failed = 0
    for action in actions:
        try:
            tools[action["name"]](db, **action["kwargs"])
        except SkillError:
            failed += 1
    return failed
