"""Spans as plain values: what the OTLP decoder (`sessionrl.capture.otlp`) gives the mapping
(`sessionrl.capture.otlp_map`), so the mapping needs no OpenTelemetry package and its tests build spans
directly.

Ids are lowercase hex (32 digits for a trace, 16 for a span), times are Unix nanoseconds, attribute
values are what OTLP's `AnyValue` holds as Python values (str, bool, int, float, bytes, lists and dicts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
"""OTLP's `Status.StatusCode` values."""


@dataclass(frozen=True)
class SpanEvent:
    """A timed event of a span (an evaluation result, an exception, ...)."""

    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """One span with its resource's attributes; `where` names it in the payload it came from."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    status_code: int = STATUS_UNSET
    status_message: str = ""
    resource: dict[str, Any] = field(default_factory=dict)
    where: str = ""

    def attr(self, key: str) -> Any:
        """The span's attribute `key`, else its resource's, else None."""
        value = self.attributes.get(key)
        return self.resource.get(key) if value is None else value

    def text(self, key: str) -> str | None:
        """The attribute as text (JSON for lists and dicts), or None when absent."""
        value = self.attr(key)
        if value is None or isinstance(value, str):
            return value
        return orjson.dumps(value).decode()


def from_ns(ns: int) -> datetime:
    """A Unix-nanosecond time as a UTC datetime (to the microsecond, as datetimes hold it).

    >>> from_ns(1_700_000_000_123_456_789).isoformat()
    '2023-11-14T22:13:20.123456+00:00'
    """
    seconds, rest = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest // 1000)


def to_ns(at: datetime) -> int:
    """A datetime as Unix nanoseconds, exactly (naive datetimes are read as UTC).

    >>> to_ns(from_ns(1_700_000_000_123_456_000))
    1700000000123456000
    """
    aware = at if at.tzinfo else at.replace(tzinfo=UTC)
    delta = aware - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def json_value(value: Any) -> Any:
    """An attribute that may hold JSON text, decoded; text that is not JSON stays text."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
