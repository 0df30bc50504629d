"""Times and warnings of imported records: a call's start, end and latency from the times its file gives,
calls in time order with each retry numbered, and the notes a converter leaves on what it kept with a
caveat (a reference to something the file lacks, a time it does not give)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

Doc = dict[str, Any]
DANGLING, MISSING_TIME, UNANSWERED = "dangling_reference", "missing_time", "unanswered_call"
"""Kinds of warning: a reference to something the file lacks, a time the file does not give, a tool call
the transcript never answers."""
Note = tuple[str, str, str]
"""A warning as a converter finds it: (field in the file's terms, what is wrong, kind)."""


def instant(value: Any) -> datetime | None:
    """A file's timestamp (RFC 3339 text, or seconds since the epoch) as an aware time; None for none or
    one that does not parse (validation then names it).

    >>> instant("2024-03-20T08:15:22.123Z").isoformat(), instant(0).year, instant("soon")
    ('2024-03-20T08:15:22.123000+00:00', 1970, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def first_given(record: Doc, names: Sequence[str]) -> Any:
    return next((record[n] for n in names if record.get(n) is not None), None)


START_NAMES, END_NAMES = ("start_timestamp", "started_at"), ("end_timestamp", "finished_at", "timestamp")
TIME_NAMES = (*START_NAMES, *END_NAMES)


def timing(record: Doc, where: str, default_at: str, notes: list[Note]) -> Doc:
    """A call's `started_at`, `finished_at` and `latency_ms` from its own times: latency is the time
    between its start and its end when both are given (or `latency_ms` as given, the start then put that
    long before the end); a call with one time started and ended then. A call without a time is placed at
    `default_at`, with a `missing_time` note."""
    start_raw, end_raw = first_given(record, START_NAMES), first_given(record, END_NAMES)
    given = record.get("latency_ms")
    latency = float(given) if isinstance(given, int | float) and not isinstance(given, bool) else None
    if start_raw is None and end_raw is None:
        notes.append((where, f"no time given: placed at {default_at}", MISSING_TIME))
        start_raw = end_raw = default_at
    start, end = instant(start_raw), instant(end_raw)
    if end is None and start is not None and end_raw is None:
        end = start + timedelta(milliseconds=latency or 0.0)
        end_raw = end.isoformat()
    elif start is None and end is not None and start_raw is None:
        start = end - timedelta(milliseconds=latency or 0.0)
        start_raw = start.isoformat()
    if latency is None and start is not None and end is not None:
        latency = max((end - start).total_seconds() * 1000, 0.0)
    out: Doc = {"started_at": start_raw, "finished_at": end_raw}
    return out if latency is None else {**out, "latency_ms": latency}


def _order_key(record: Any, field: str = "finished_at") -> tuple[bool, datetime]:
    at = instant(record.get(field)) if isinstance(record, dict) else None
    return at is None, at or datetime.min.replace(tzinfo=UTC)


def time_order(records: list[Any], field: str = "finished_at") -> list[Any]:
    """Records by their time `field` (calls by when they ended); stable, and records without a readable
    time go last, in their order."""
    return sorted(records, key=lambda record: _order_key(record, field))


def numbered(calls: list[Any], given: Sequence[bool]) -> list[Any]:
    """The calls, each call of one tool for one sub-goal numbered by time after those before it (its
    `attempt`: a retry is attempt 2), in the order given; a call naming no sub-goal, or whose file gives
    its attempt (`given[i]`), keeps its own.

    >>> calls = [{"subgoal_id": "a", "tool": "t", "finished_at": f"2024-01-01T00:00:0{s}Z"} for s in (2, 1)]
    >>> [(c["finished_at"][-2], c["attempt"]) for c in numbered(calls, [False, False])]
    [('2', 2), ('1', 1)]
    """
    seen: Counter[tuple[str, str]] = Counter()
    out = list(calls)
    for i in sorted(range(len(calls)), key=lambda i: _order_key(calls[i])):
        call = calls[i]
        if isinstance(call, dict) and isinstance(call.get("subgoal_id"), str) and not given[i]:
            mark = (call["subgoal_id"], str(call.get("tool")))
            seen[mark] += 1
            out[i] = {**call, "attempt": seen[mark]}
    return out
