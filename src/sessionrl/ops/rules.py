"""Canary rules as safe expressions over named metrics, compiled with CEL (as reward rules are).

A rule reads the analysis's numbers by name (`tcsr_drop`, `dvr_drop`, `success_gain`, ... see `VARIABLES`)
and may use `and`, `or`, `not` as well as CEL's `&&`, `||`, `!`. Nothing else runs: CEL has no side
effects, and a rule naming an unknown metric is refused when it is compiled.

>>> holds("tcsr_drop > 0.005 or dvr_drop > 0.02", {"tcsr_drop": 0.01, "dvr_drop": 0.0})
True
>>> holds("success_gain >= 0 and tcsr_gain >= 0", {"success_gain": -0.1, "tcsr_gain": 0.2})
False
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

import cel

from sessionrl.errors import InvalidEvent

METRICS = ("success", "tcsr", "dvr", "spt", "risk", "rating", "coherence")
"""The metrics an analysis compares (see `sessionrl.ops.analysis`)."""

VARIABLES = frozenset(
    [f"{m}_{part}" for m in METRICS for part in ("drop", "gain", "p")]
    + [f"{m}_{arm}" for m in METRICS for arm in ("a", "b")]
    + ["n_a", "n_b"]
)
"""Names a rule may read: for each metric, `<m>_drop` (A minus B, so a worse B is positive), `<m>_gain`
(B minus A), `<m>_p` (the test's p-value), `<m>_a` and `<m>_b` (each arm's value); and the sample sizes."""

_WORDS = {"and": "&&", "or": "||", "not": "!"}
_WORD = re.compile(r"\b(and|or|not)\b")


def to_cel(rule: str) -> str:
    """The rule in CEL's spelling (`and`/`or`/`not` become `&&`/`||`/`!`; rules hold no strings).

    >>> to_cel("a > 1 or not b < 2")
    'a > 1 || ! b < 2'
    """
    if '"' in rule or "'" in rule:
        raise InvalidEvent("rule", "a canary rule compares numbers; it may not hold quoted strings")
    return _WORD.sub(lambda m: _WORDS[m.group(1)], rule)


@lru_cache(maxsize=64)
def compile_rule(rule: str) -> cel.Program:
    """The compiled rule; `InvalidEvent` saying why when it does not compile or reads unknown names."""
    try:
        program = cel.compile(to_cel(rule))
    except ValueError as exc:
        raise InvalidEvent("rule", f"{rule!r} does not compile: {exc}") from exc
    unknown = sorted(set(program.variables()) - VARIABLES)
    if unknown:
        raise InvalidEvent("rule", f"{rule!r} reads unknown metric(s) {unknown}; known: {sorted(VARIABLES)}")
    return program


def holds(rule: str, values: Mapping[str, float]) -> bool:
    """Whether the rule is true for these values (a metric absent from `values` reads as 0.0)."""
    program = compile_rule(rule)
    context = cel.Context({name: float(values.get(name, 0.0)) for name in program.variables()})
    result = program.execute(context)
    if not isinstance(result, bool):
        raise InvalidEvent("rule", f"{rule!r} gives {result!r}, not true or false")
    return result
