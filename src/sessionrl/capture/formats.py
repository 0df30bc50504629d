"""The file formats `sessionrl sessions import` and `export` speak, and one reader per import format."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from sessionrl.capture.importers import ReadRecords, read_records
from sessionrl.capture.langfuse import read_langfuse
from sessionrl.capture.langsmith import read_langsmith
from sessionrl.capture.otlp_import import read_otlp


class ImportFormat(StrEnum):
    """sessionrl's own records (event envelopes, session documents, the seed shape, OpenAI transcripts),
    or traces: OTLP (JSON or protobuf), a Langfuse dump, a LangSmith dump (see docs/traces.md)."""

    SESSIONRL = "sessionrl"
    OTLP = "otlp"
    LANGFUSE = "langfuse"
    LANGSMITH = "langsmith"


class ExportFormat(StrEnum):
    """JSON Lines of event envelopes (or session documents), or OTLP/JSON: one request per session."""

    JSONL = "jsonl"
    OTLP = "otlp"


READERS: dict[ImportFormat, Callable[[bytes], ReadRecords]] = {
    ImportFormat.SESSIONRL: read_records,
    ImportFormat.OTLP: read_otlp,
    ImportFormat.LANGFUSE: read_langfuse,
    ImportFormat.LANGSMITH: read_langsmith,
}


def read_file(fmt: ImportFormat, data: bytes) -> ReadRecords:
    """A file's records in sessionrl's shapes, and its problems (trace formats add warnings)."""
    return READERS[fmt](data)
