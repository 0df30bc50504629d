"""What the trace importers share: ids made from foreign ones, scores as evaluation events, records and
warnings from assembled sessions, and a reader of dump files.

Langfuse observations and LangSmith runs are turned into spans (`sessionrl.capture.otlp_spans`) and go
through the same mapping as OTLP spans, so every way in gives sessions the same shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import orjson

from sessionrl.capture.importers import ImportProblem, ReadRecords
from sessionrl.capture.otlp_assembly import Assembled
from sessionrl.capture.otlp_map import EVALUATION_EVENT
from sessionrl.capture.otlp_spans import SpanEvent, to_ns
from sessionrl.session import codec
from sessionrl.session.model import FeedbackType

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def trace_id_of(text: str) -> str:
    """A W3C trace id for a foreign trace id: itself when it is one (a UUID's hex digits too).

    >>> trace_id_of("0af76519-16cd-43dd-8448-eb211c80319c"), len(trace_id_of("my trace"))
    ('0af7651916cd43dd8448eb211c80319c', 32)
    """
    plain = text.replace("-", "").lower()
    return plain if HEX32.match(plain) and any(c != "0" for c in plain) else _hash(text, 16)


def span_id_of(text: str) -> str:
    """A 16-hex-digit span id for a foreign observation or run id: itself when it is one."""
    plain = text.lower()
    return plain if HEX16.match(plain) and any(c != "0" for c in plain) else _hash(text, 8)


def _hash(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def json_text(value: Any) -> str | None:
    """A value as an attribute: text as it is, anything else as JSON, None as absent."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value, default=str).decode()


def score_event(
    *,
    score_id: str,
    name: str,
    value: float | None,
    comment: str | None,
    source: str,
    human: bool,
    occurred_at: datetime,
    received_at: datetime,
    data: dict[str, Any],
) -> SpanEvent:
    """A score or piece of feedback as an evaluation event, its source kept as its annotator and data.

    A person's score from 1 to 5 is a human rating; another score an automatic validation; text alone a
    comment."""
    kind = FeedbackType.COMMENT if value is None else FeedbackType.AUTO_VALIDATION
    if human and value is not None and 1 <= value <= 5:
        kind = FeedbackType.HUMAN_RATING
    attributes = {
        "gen_ai.evaluation.name": name,
        "gen_ai.evaluation.score.value": value,
        "gen_ai.evaluation.explanation": comment,
        "sessionrl.feedback.id": score_id,
        "sessionrl.feedback.type": kind.value,
        "sessionrl.feedback.annotator": f"{source}:{name}",
        "sessionrl.feedback.occurred_at": occurred_at.isoformat(),
        "sessionrl.feedback.received_at": received_at.isoformat(),
        "sessionrl.feedback.data": orjson.dumps(
            {"source": source, "name": name, **data}, default=str
        ).decode(),
    }
    return SpanEvent(
        EVALUATION_EVENT, to_ns(occurred_at), {k: v for k, v in attributes.items() if v is not None}
    )


def records(assembled: Assembled, lines: dict[str, int], read: ReadRecords) -> ReadRecords:
    """Assembled sessions as import records (and their warnings), each at the line of its first span."""
    for span, rule, kind in assembled.warnings:
        line = lines.get(span.span_id, 1) if span is not None else 1
        where = (span.where or span.span_id) if span is not None else "spans"
        read.warnings.append(ImportProblem(line, where, rule, kind))
    for session, members in zip(assembled.sessions, assembled.members, strict=True):
        line = min((lines[m] for m in members if m in lines), default=1)
        read.records.append((line, codec.dumps(session)))
    read.records.sort(key=lambda record: record[0])
    return read


def json_items(
    data: bytes, lists: tuple[str, ...], problems: list[ImportProblem]
) -> Iterator[tuple[int, str, Any]]:
    """(line, field prefix, item) of every record of a dump: JSON Lines (a malformed line is a problem),
    or one document that is an array of records, an object holding them under one of `lists`, or one
    record."""
    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        yield from ((1, f"[{i}].", item) for i, item in enumerate(whole))
    elif isinstance(whole, dict) and any(k in whole for k in lists):
        for key in lists:
            items = whole.get(key)
            yield from (
                (1, f"{key}[{i}].", x) for i, x in enumerate(items if isinstance(items, list) else [])
            )
    elif whole is not None:
        yield 1, "", whole
    else:
        for number, raw in enumerate(data.splitlines(), start=1):
            if raw.strip():
                try:
                    yield number, "", orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    problems.append(ImportProblem(number, "line", f"malformed JSON: {exc}"))


def camel(name: str) -> str:
    """A model's field name as the API spells it.

    >>> camel("parent_observation_id")
    'parentObservationId'
    """
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
