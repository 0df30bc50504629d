"""`sessionrl sessions import --format langfuse`: Langfuse observations and scores as sessions.

The file is what Langfuse's public API gives, read through the `langfuse` SDK's own models
(`ObservationV2`, `Score`): JSON Lines of observations and scores, or one JSON document that is an
array of them, an API page (`{"data": [...]}`), or `{"observations": [...], "scores": [...]}`. A
score is told from an observation by its `dataType`.

Each Langfuse trace is one session. Observations become spans for the common mapping: a GENERATION is
an LLM call (its `input` the chat messages, its `output` the answer, `usageDetails` the token counts), a
TOOL observation a tool call, others the session's structure (the root's input gives the request). An
observation at level ERROR failed, with its status message. Scores become feedback on the observation
they name (else on the session), keeping their source (`ANNOTATION`, `API`, `EVAL`), name, comment,
author and value type; a person's score from 1 to 5 is a human rating.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sessionrl.capture.importers import ImportProblem, ReadRecords
from sessionrl.capture.otlp_assembly import sessions_from_spans
from sessionrl.capture.otlp_spans import STATUS_ERROR, STATUS_UNSET, Span, SpanEvent, to_ns
from sessionrl.capture.timing import DANGLING
from sessionrl.capture.trace_records import (
    camel,
    json_items,
    json_text,
    records,
    score_event,
    span_id_of,
    trace_id_of,
)
from sessionrl.errors import SessionRLError

KINDS = {"GENERATION": "LLM", "TOOL": "TOOL"}


class LangfuseUnavailable(SessionRLError):
    def __init__(self) -> None:
        super().__init__("reading Langfuse files needs the langfuse SDK: pip install 'sessionrl[traces]'")


def read_langfuse(data: bytes) -> ReadRecords:
    """Every session a Langfuse dump holds; problems name the line and the field in Langfuse's terms."""
    ObservationV2, Score, parse = _models()
    read = ReadRecords()
    observations: list[tuple[int, Any]] = []
    scores: list[tuple[int, Any]] = []
    for line, prefix, item in json_items(data, ("data", "observations", "scores"), read.problems):
        is_score = isinstance(item, dict) and "dataType" in item
        try:
            parsed = parse(Score if is_score else ObservationV2, item)
        except ValidationError as exc:
            read.problems += _problems(line, prefix, exc)
            continue
        (scores if is_score else observations).append((line, parsed))
    spans, lines = _spans(observations, scores, read.warnings)
    return records(sessions_from_spans(spans), lines, read)


def _models() -> tuple[Any, Any, Any]:
    try:
        from langfuse.api import ObservationV2, Score
        from langfuse.api.core.pydantic_utilities import parse_obj_as
    except ImportError as exc:
        raise LangfuseUnavailable() from exc
    return ObservationV2, Score, parse_obj_as


def _problems(line: int, prefix: str, exc: ValidationError) -> list[ImportProblem]:
    return [
        ImportProblem(
            line, prefix + ".".join(camel(str(p)) for p in e["loc"] if not str(p)[0].isupper()), e["msg"]
        )
        for e in exc.errors()
    ]


def _spans(
    observations: list[tuple[int, Any]], scores: list[tuple[int, Any]], warnings: list[ImportProblem]
) -> tuple[list[Span], dict[str, int]]:
    """Observations as spans, each score as an event on the span of its observation (or trace root)."""
    events: dict[str, list[SpanEvent]] = {}
    roots: dict[str, str] = {}
    for _, o in observations:
        if o.parent_observation_id is None and o.trace_id is not None:
            roots.setdefault(o.trace_id, o.id)
    known = {o.id for _, o in observations}
    for line, s in scores:
        target = s.observation_id or roots.get(s.trace_id or "")
        if target is None or target not in known:
            said = f"score {s.id}: its observation is not in the file, nor a root observation of its trace"
            warnings.append(ImportProblem(line, "observationId", said, DANGLING))
            continue
        events.setdefault(target, []).append(_score(s))
    spans = [_span(o, tuple(events.get(o.id, ()))) for _, o in observations]
    return spans, {span.span_id: line for span, (line, _) in zip(spans, observations, strict=True)}


def _span(o: Any, events: tuple[SpanEvent, ...]) -> Span:
    kind = KINDS.get(str(o.type).upper(), "CHAIN")
    usage = o.usage_details or {}
    attributes = {
        "openinference.span.kind": kind,
        "input.value": json_text(o.input),
        "output.value": json_text(o.output),
        "llm.model_name": o.model,
        "llm.token_count.prompt": usage.get("input"),
        "llm.token_count.completion": usage.get("output"),
        "llm.token_count.total": usage.get("total"),
        "tool.name": o.name if kind == "TOOL" else None,
        "tool.id": (o.metadata or {}).get("tool_call_id") if kind == "TOOL" else None,
        "session.id": o.session_id,
        "user.id": o.user_id,
        "langfuse.observation.type": o.type,
    }
    failed = str(o.level or "").upper() == "ERROR"
    start = to_ns(o.start_time)
    return Span(
        trace_id=trace_id_of(o.trace_id or o.id),
        span_id=span_id_of(o.id),
        parent_span_id=span_id_of(o.parent_observation_id) if o.parent_observation_id else None,
        name=o.name or str(o.type),
        start_ns=start,
        end_ns=to_ns(o.end_time) if o.end_time else start,
        attributes={k: v for k, v in attributes.items() if v is not None},
        events=events,
        status_code=STATUS_ERROR if failed else STATUS_UNSET,
        status_message=(o.status_message or "") if failed else "",
        resource={"sessionrl.source": "langfuse"},
        where=o.id,
    )


def _score(s: Any) -> SpanEvent:
    value = getattr(s, "value", None)
    number = float(value) if isinstance(value, int | float) else None
    data = {
        "data_type": s.data_type,
        "string_value": getattr(s, "string_value", None),
        "author": s.author_user_id,
    }
    if isinstance(value, str):
        data["value"] = value
    return score_event(
        score_id=f"langfuse-{s.id}",
        name=s.name,
        value=number,
        comment=s.comment,
        source=f"langfuse:{str(s.source).lower()}",
        human=str(s.source).upper() == "ANNOTATION",
        occurred_at=s.timestamp,
        received_at=s.created_at,
        data={k: v for k, v in data.items() if v is not None},
    )
