"""Per-call credit for dense rewards: the right tool, and values read from earlier results.

Two Python terms that a rule file imports by path (`examples/rewards/dense_credit.yaml`):

    right_tool     +1 for each call of a tool the task's expert plan uses, -1 for each call of another;
                   the tools come from the session's `expected_tools` metadata (the episode driver writes
                   it, `sessionrl.episodes.metadata`); a session without it earns 0 and says why
    reads_results  +1 for each call that passes a value an earlier call's output held and the request did
                   not (an order id looked up, a waybill generated): the value was read, not guessed

Each credits the calls it judges (`TermResult.steps`), so GRPO's per-call advantage (`step_coef`) can tell
a reply that picked the right tool apart from one that did not, even when neither episode solved its task.
The other per-call signals of a dense recipe are plain CEL rules in the rule file: a call's success, its
arguments passing validation, a reply that was no action; the recovery term is a built-in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sessionrl.rewards.terms import ScoringContext, TermResult
from sessionrl.session.model import CallStatus, Session

MIN_CHARS = 3
"""Shortest value that counts as read from a result: shorter ones (a quantity of 2, "ok") are too common
to say where they came from."""


def right_tool(session: Session, ctx: ScoringContext) -> TermResult:
    """+1 for each call of an expected tool, -1 for each other call (see the module doc)."""
    expected = session.metadata.get("expected_tools")
    if not isinstance(expected, list) or not expected:
        return TermResult(0.0, {}, "no expected_tools in the session's metadata")
    steps = {c.call_id: 1.0 if c.tool in expected else -1.0 for c in session.tool_calls}
    right = sum(v > 0 for v in steps.values())
    return TermResult(sum(steps.values()), steps, f"{right} of {len(steps)} calls used an expected tool")


def values_in(value: Any) -> Iterator[str]:
    """The leaf values of a JSON value as text (numbers included, booleans and nulls not), each at least
    `MIN_CHARS` long.

    >>> sorted(values_in({"id": "W-9", "items": [{"sku": 1024, "ok": True}], "n": 2}))
    ['1024', 'W-9']
    """
    if isinstance(value, dict):
        for item in value.values():
            yield from values_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from values_in(item)
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        text = str(value)
        if len(text) >= MIN_CHARS:
            yield text


def reads_results(session: Session, ctx: ScoringContext) -> TermResult:
    """+1 for each call that passes a value an earlier successful call returned and the request did not
    name (see the module doc)."""
    seen: set[str] = set()
    steps: dict[str, float] = {}
    for call in sorted(session.tool_calls, key=lambda c: c.started_at):
        read = {v for v in values_in(call.params) if v in seen and v not in session.user_query}
        if read:
            steps[call.call_id] = 1.0
        if call.status is CallStatus.SUCCESS:
            seen.update(values_in(call.output))
    return TermResult(float(len(steps)), steps, f"{len(steps)} calls passed values earlier results held")


__all__ = ["MIN_CHARS", "reads_results", "right_tool", "values_in"]
