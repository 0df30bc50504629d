"""`sessionrl sessions import --format otlp`: OTLP trace files as session documents.

A file is OTLP/JSON (one `ExportTraceServiceRequest` document, or one per line as `sessionrl sessions
export --format otlp` writes them) or one protobuf-encoded request. Each line's spans are read and
checked; a request that cannot be read is a problem that stops the import (with its line), while a span
that cannot be used (no trace id, say) or one whose parent is not in the file is a warning, and the
rest is imported. The warnings of a session are also kept in its metadata (`otlp_warnings`).
"""

from __future__ import annotations

import orjson

from sessionrl.capture.importers import ImportProblem, ReadRecords
from sessionrl.capture.otlp import BadPayload, decode
from sessionrl.capture.otlp_assembly import UNUSABLE, sessions_from_spans
from sessionrl.capture.otlp_spans import Span
from sessionrl.capture.trace_records import records


def read_otlp(data: bytes, group_by: str | None = None) -> ReadRecords:
    """Every session an OTLP file holds, one document each, with the line its first span is on."""
    read = ReadRecords()
    spans: list[Span] = []
    lines: dict[str, int] = {}
    for number, body, json in _requests(data):
        try:
            decoded = decode(body, json=json)
        except BadPayload as exc:
            read.problems += [ImportProblem(number, where, rule) for where, rule in exc.problems]
            continue
        read.warnings += [
            ImportProblem(number, where, f"span left out: {rule}", UNUSABLE)
            for where, rule in decoded.problems
        ]
        for span in decoded.spans:
            lines.setdefault(span.span_id, number)
        spans += decoded.spans
    return records(sessions_from_spans(spans, group_by), lines, read)


def _requests(data: bytes) -> list[tuple[int, bytes, bool]]:
    """(line, body, is JSON) of each request in a file: JSON Lines, one JSON document or an array of
    them, or else one protobuf request."""
    first = data.lstrip()[:1]
    if first not in (b"{", b"["):
        return [(1, data, False)]
    lines = [(i, raw) for i, raw in enumerate(data.splitlines(), start=1) if raw.strip()]
    if len(lines) > 1 and _stands_alone(lines[0][1]):
        return [(i, raw, True) for i, raw in lines]
    if first == b"[":
        try:
            items = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [(lines[0][0], data, True)]
        return [(lines[0][0], orjson.dumps(item), True) for item in items]
    return [(lines[0][0], data, True)]


def _stands_alone(line: bytes) -> bool:
    """Whether a line is a whole JSON value (so the file is JSON Lines)."""
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True
