"""`sessionrl sessions import --format langsmith`: LangSmith runs and their feedback as sessions.

The file holds runs and feedback as LangSmith's API gives them, read through the `langsmith` SDK's own
models (`Run`, `Feedback`): JSON Lines of runs and feedback, or one JSON document that is an array of
them or `{"runs": [...], "feedback": [...]}`. A feedback record is told from a run by its `key`.

Each trace (`trace_id`) is one session. Runs become spans for the common mapping: an `llm` run is an LLM
call (`inputs.messages` in OpenAI's or LangChain's message shape, `outputs` a chat completion, a message
or generations, token counts from the run or `usage_metadata`), a `tool` run a tool call (`inputs` its
arguments, `outputs.output` its result), other runs the structure (the root's input gives the request).
A run with an `error` failed. Feedback becomes feedback on its run, keeping its key, score or value,
comment, correction and source (`feedback_source.type`, its user); a person's score from 1 to 5 is a
human rating.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sessionrl.capture.importers import ImportProblem, ReadRecords
from sessionrl.capture.otlp_assembly import sessions_from_spans
from sessionrl.capture.otlp_spans import STATUS_ERROR, STATUS_UNSET, Span, SpanEvent, to_ns
from sessionrl.capture.timing import DANGLING
from sessionrl.capture.trace_records import (
    json_items,
    json_text,
    records,
    score_event,
    span_id_of,
    trace_id_of,
)
from sessionrl.errors import SessionRLError
from sessionrl.session.model import utcnow

KINDS = {"llm": "LLM", "tool": "TOOL", "retriever": "RETRIEVER", "embedding": "EMBEDDING"}
HUMAN_SOURCES = {"app", "api"}


class LangSmithUnavailable(SessionRLError):
    def __init__(self) -> None:
        super().__init__("reading LangSmith files needs the langsmith SDK: pip install 'sessionrl[traces]'")


def read_langsmith(data: bytes) -> ReadRecords:
    """Every session a LangSmith dump holds; problems name the line and the field in LangSmith's terms."""
    Run, Feedback = _models()
    read = ReadRecords()
    runs: list[tuple[int, Any]] = []
    feedback: list[tuple[int, Any]] = []
    for line, prefix, item in json_items(data, ("runs", "feedback"), read.problems):
        is_feedback = isinstance(item, dict) and "key" in item
        try:
            parsed = (Feedback if is_feedback else Run).model_validate(item)
        except ValidationError as exc:
            read.problems += [
                ImportProblem(line, prefix + ".".join(str(p) for p in e["loc"]), e["msg"])
                for e in exc.errors()
            ]
            continue
        (feedback if is_feedback else runs).append((line, parsed))
    spans, lines = _spans(runs, feedback, read.warnings)
    return records(sessions_from_spans(spans), lines, read)


def _models() -> tuple[Any, Any]:
    try:
        from langsmith.schemas import Feedback, Run
    except ImportError as exc:
        raise LangSmithUnavailable() from exc
    return Run, Feedback


def _spans(
    runs: list[tuple[int, Any]], feedback: list[tuple[int, Any]], warnings: list[ImportProblem]
) -> tuple[list[Span], dict[str, int]]:
    events: dict[str, list[SpanEvent]] = {}
    known = {str(run.id) for _, run in runs}
    for line, f in feedback:
        if f.run_id is None or str(f.run_id) not in known:
            warnings.append(
                ImportProblem(line, "run_id", f"feedback {f.id}: its run is not in the file", DANGLING)
            )
            continue
        events.setdefault(str(f.run_id), []).append(_feedback(f))
    spans = [_span(run, tuple(events.get(str(run.id), ()))) for _, run in runs]
    return spans, {span.span_id: line for span, (line, _) in zip(spans, runs, strict=True)}


def _span(run: Any, events: tuple[SpanEvent, ...]) -> Span:
    kind = KINDS.get(run.run_type, "CHAIN")
    inputs, outputs = run.inputs or {}, run.outputs or {}
    usage = outputs.get("usage_metadata") or {}
    attributes = {
        "openinference.span.kind": kind,
        "input.value": json_text(_input(kind, run.parent_run_id is None, inputs)),
        "output.value": json_text(_output(kind, outputs)),
        "llm.model_name": _model(run),
        "llm.token_count.prompt": run.prompt_tokens or usage.get("input_tokens"),
        "llm.token_count.completion": run.completion_tokens or usage.get("output_tokens"),
        "llm.token_count.total": run.total_tokens or usage.get("total_tokens"),
        "tool.name": run.name if kind == "TOOL" else None,
        "tool.id": ((run.extra or {}).get("metadata") or {}).get("tool_call_id") if kind == "TOOL" else None,
        "langsmith.run_type": run.run_type,
    }
    start = to_ns(run.start_time)
    return Span(
        trace_id=trace_id_of(str(run.trace_id or run.id)),
        span_id=span_id_of(str(run.id)),
        parent_span_id=span_id_of(str(run.parent_run_id)) if run.parent_run_id else None,
        name=run.name,
        start_ns=start,
        end_ns=to_ns(run.end_time) if run.end_time else start,
        attributes={k: v for k, v in attributes.items() if v is not None},
        events=events,
        status_code=STATUS_ERROR if run.error else STATUS_UNSET,
        status_message=run.error or "",
        resource={"sessionrl.source": "langsmith"},
        where=str(run.id),
    )


def _input(kind: str, root: bool, inputs: dict[str, Any]) -> Any:
    """What the mapping reads as the span's input: messages for an LLM run, arguments for a tool run,
    and for the root run its one text input (the request), when it has one."""
    if kind == "LLM":
        messages = inputs.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], list):
            messages = messages[0]  # LangChain's batch of one conversation
        return {"messages": [_message(m) for m in messages]} if isinstance(messages, list) else inputs
    if kind == "TOOL":
        return inputs.get("input", inputs) if set(inputs) <= {"input"} else inputs
    texts = [v for v in inputs.values() if isinstance(v, str)]
    return texts[0] if root and len(texts) == 1 else inputs


def _message(m: Any) -> Any:
    """A LangChain message (`{"type": "human", "content": ...}`, or serialised with `kwargs`) in OpenAI's
    shape; OpenAI messages pass through."""
    if not isinstance(m, dict) or "role" in m:
        return m
    nested = m.get("kwargs", m.get("data"))
    kwargs: dict[str, Any] = nested if isinstance(nested, dict) else m
    kind = str(m.get("type") if m.get("type") != "constructor" else (m.get("id") or [""])[-1]).lower()
    role = {
        "human": "user",
        "humanmessage": "user",
        "ai": "assistant",
        "aimessage": "assistant",
        "system": "system",
        "systemmessage": "system",
        "tool": "tool",
        "toolmessage": "tool",
    }.get(kind, "user")
    calls = [
        {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("args", {})}}
        for c in kwargs.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return {
        "role": role,
        "content": kwargs.get("content"),
        "tool_calls": calls,
        "tool_call_id": kwargs.get("tool_call_id"),
    }


def _output(kind: str, outputs: dict[str, Any]) -> Any:
    if kind == "TOOL":
        return outputs.get("output", outputs)
    generations = outputs.get("generations")
    if kind == "LLM" and isinstance(generations, list) and generations:
        first = generations[0][0] if isinstance(generations[0], list) else generations[0]
        message = first.get("message") if isinstance(first, dict) else None
        return _message(message) if isinstance(message, dict) else (first or {}).get("text", "")
    if kind != "LLM" and set(outputs) == {"output"}:
        return outputs["output"]
    return outputs


def _model(run: Any) -> str | None:
    extra = run.extra or {}
    params = extra.get("invocation_params") or {}
    metadata = extra.get("metadata") or {}
    name = (
        (run.outputs or {}).get("model")
        or params.get("model")
        or params.get("model_name")
        or metadata.get("ls_model_name")
    )
    return str(name) if name else None


def _feedback(f: Any) -> SpanEvent:
    source = f.feedback_source
    kind = str(getattr(source, "type", None) or "api").lower()
    score = f.score
    value = float(score) if isinstance(score, int | float) else None
    data = {
        "value": f.value,
        "correction": f.correction,
        "user_id": str(getattr(source, "user_id", None) or "") or None,
    }
    occurred = f.created_at or f.modified_at or utcnow()  # LangSmith always sets them; an edited file may not
    return score_event(
        score_id=f"langsmith-{f.id}",
        name=f.key,
        value=value,
        comment=f.comment,
        source=f"langsmith:{kind}",
        human=kind in HUMAN_SOURCES,
        occurred_at=occurred,
        received_at=f.modified_at or occurred,
        data={k: v for k, v in data.items() if v is not None},
    )
