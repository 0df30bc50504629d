"""Reading trace files into sessionrl's own import records, whatever their layout and shape.

Layout: JSON Lines (one record per line) or one JSON document, pretty-printed or not (an object, or an
array of records), told apart by whether the first line stands alone as JSON. Shapes:

- sessionrl's own: event envelopes (`{"session_id", "event"}`) and session documents, which must name
  their `schema_version` (read without one, a current document would be taken for version 1 and fail
  on fields that version never had);
- the design document's worked session: `start_timestamp`, `agent_plan.sub_goals`,
  `tool_calls[].tool_name` / `input_params`, `llm_calls[].prompt`, `feedback` (or `human_feedback`)
  with `annotator_id`, `end_timestamp`, `final_output` as text;
- an OpenAI chat transcript: `messages` (with assistant `tool_calls` and `tool` messages answering them
  by `tool_call_id`), optional `session_id`, `model`, `reward` and `feedback`.

Every record comes back as the JSON of a sessionrl envelope or current session document, with the line
it started on; every problem of every record is reported in one pass, naming its line and the field in
the file's own terms.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from sessionrl.capture.timing import (
    DANGLING,
    MISSING_TIME,
    TIME_NAMES,
    UNANSWERED,
    Note,
    first_given,
    instant,
    numbered,
    time_order,
    timing,
)
from sessionrl.orchestrator.recording import tool_message_result, tool_output_result
from sessionrl.session.model import SCHEMA_VERSION, CallStatus, Session

Doc = dict[str, Any]


@dataclass(frozen=True)
class ImportProblem:
    """One thing wrong with a record: the line it starts on, the field, and the rule it breaks; for a
    warning (kept, with a caveat), also its `kind`, which the import's summary counts."""

    line: int
    field: str
    rule: str
    kind: str = ""


@dataclass
class ReadRecords:
    """What a file holds: native records as JSON with the line each starts on, the problems that stop the
    import, and the warnings that do not (each kept as the file has it, or as the warning says)."""

    records: list[tuple[int, bytes]] = field(default_factory=list)
    problems: list[ImportProblem] = field(default_factory=list)
    warnings: list[ImportProblem] = field(default_factory=list)


def warning_summary(warnings: Sequence[ImportProblem]) -> str:
    """The warnings counted by kind, for the import's summary line.

    >>> late, lost = ImportProblem(1, "f", "r", MISSING_TIME), ImportProblem(1, "g", "r", DANGLING)
    >>> warning_summary([late, late, lost])
    '3 warning(s): 1 dangling reference, 2 missing time'
    """
    if not warnings:
        return "no warnings"
    counts = Counter(w.kind or "other" for w in warnings)
    kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(counts.items()))
    return f"{len(warnings)} warning(s): {kinds}"


class BadRecord(Exception):
    """Everything wrong with one record, as (field, rule) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {r}" for f, r in problems))
        self.problems = problems


def read_records(data: bytes) -> ReadRecords:
    """Every record of a file, converted to sessionrl's shapes, every problem of every record, and every
    warning of the records that import."""
    read = ReadRecords()
    for line, prefix, value in _values(data, read.problems):
        notes: list[Note] = []
        try:
            native = to_native(value, notes)
        except BadRecord as exc:
            read.problems += [ImportProblem(line, prefix + where, rule) for where, rule in exc.problems]
            continue
        read.records.append((line, orjson.dumps(native)))
        read.warnings += [ImportProblem(line, prefix + where, rule, kind) for where, rule, kind in notes]
    return read


def _values(data: bytes, problems: list[ImportProblem]) -> Iterator[tuple[int, str, Any]]:
    """(line, field prefix, value) of each record: JSON Lines, or one document (an array's items too)."""
    lines = data.splitlines()
    first = next((i for i, raw in enumerate(lines) if raw.strip()), None)
    if first is None:
        return
    whole = _whole_document(data, lines[first])
    if whole is not None:
        items = whole if isinstance(whole, list) else [whole]
        prefix = "[{}]." if isinstance(whole, list) else ""
        for i, item in enumerate(items):
            yield first + 1, prefix.format(i), item
        return
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield number, "", orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(ImportProblem(number, "line", f"malformed JSON: {exc}"))


def _whole_document(data: bytes, first_line: bytes) -> Any:
    """The file as one JSON document, when it is one spread over lines; None for JSON Lines."""
    try:
        orjson.loads(first_line)
        standalone = True
    except orjson.JSONDecodeError:
        standalone = False
    if standalone and len([raw for raw in data.splitlines() if raw.strip()]) > 1:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def to_native(value: Any, notes: list[Note] | None = None) -> Any:
    """A record in sessionrl's own shape (an envelope or a current session document), or `BadRecord`;
    what is kept with a caveat is added to `notes`."""
    notes = [] if notes is None else notes
    if not isinstance(value, dict):
        raise BadRecord([("record", "expected a JSON object")])
    if "event" in value:
        return value
    if "messages" in value:
        return from_openai(value, notes)
    if _is_seed(value):
        return from_seed(value, notes)
    if "schema_version" not in value:
        raise BadRecord(
            [
                (
                    "schema_version",
                    f"missing: a session document names its schema version (current: {SCHEMA_VERSION}), "
                    "as `sessionrl sessions export --documents` writes it",
                )
            ]
        )
    return value


def _is_seed(doc: Doc) -> bool:
    calls = doc.get("tool_calls")
    named = isinstance(calls, list) and any(isinstance(c, dict) and "tool_name" in c for c in calls)
    return named or any(k in doc for k in ("agent_plan", "start_timestamp", "human_feedback"))


def derived_id(prefix: str, *parts: object) -> str:
    """A stable id from the record's content, so importing it twice stores it once."""
    digest = hashlib.blake2b(orjson.dumps(parts, default=str), digest_size=10).hexdigest()
    return f"{prefix}_{digest}"


def _trace_id(session_id: str) -> str:
    return hashlib.blake2b(session_id.encode(), digest_size=16).hexdigest()


# the design document's worked session

SEED_FIELDS = {
    "plan.subgoals": "agent_plan.sub_goals",
    "plan": "agent_plan",
    "created_at": "start_timestamp",
    "updated_at": "end_timestamp",
}
SEED_CALL_FIELDS = {"tool": "tool_name", "params": "input_params", "subgoal_id": "sub_goal_id"}
SEED_FEEDBACK_FIELDS = {"annotator": "annotator_id", "occurred_at": "timestamp", "received_at": "timestamp"}


def from_seed(doc: Doc, notes: list[Note]) -> Doc:
    """The design document's session shape as a current session document: its events in time order,
    each retry of a tool for a sub-goal numbered, latencies from the times given; references to what the
    file lacks and times it does not give are noted (`DANGLING`, `MISSING_TIME`)."""
    sid = str(doc.get("session_id") or derived_id("seed", doc.get("user_query"), doc.get("start_timestamp")))
    plan = doc.get("agent_plan")
    feedback_key = "feedback" if "feedback" in doc else "human_feedback"
    feedback = doc.get(feedback_key) or []
    final = doc.get("final_output")
    start = _seed_start(doc, notes)
    tools = _list(doc.get("tool_calls"))
    tool_calls = numbered(
        [_seed_tool_call(c, f"tool_calls.{i}", start, notes) for i, c in enumerate(tools)],
        [isinstance(c, dict) and "attempt" in c for c in tools],
    )
    llm_calls = [
        _seed_llm_call(c, f"llm_calls.{i}", start, notes) for i, c in enumerate(_list(doc.get("llm_calls")))
    ]
    ended = _seed_end(doc, [*tool_calls, *llm_calls], start, notes)
    _seed_references(doc, notes)
    native: Doc = {
        "schema_version": SCHEMA_VERSION,
        "session_id": sid,
        "trace_id": _trace_id(sid),
        "state": "finished" if final is not None or doc.get("end_timestamp") else "executing",
        "user_query": doc.get("user_query"),
        "scenario": doc.get("scenario"),
        "tags": doc.get("tags", []),
        "metadata": {"imported_from": "seed", **_sub_goal_calls(plan)},
        "plan": _seed_plan(plan),
        "tool_calls": tool_calls,
        "llm_calls": llm_calls,
        "feedback": [
            _seed_feedback(sid, i, f, f"{feedback_key}.{i}", ended, notes)
            for i, f in enumerate(_list(feedback))
        ],
        "final_output": {"text": final} if isinstance(final, str) else final,
        "created_at": start,
        "updated_at": ended,
    }
    _validate(native, lambda where: _seed_field(where, feedback_key))  # its problems name the file's order
    for records, at in (
        ("tool_calls", "finished_at"),
        ("llm_calls", "finished_at"),
        ("feedback", "received_at"),
    ):
        native[records] = time_order(native[records], at)
    return native


def _seed_start(doc: Doc, notes: list[Note]) -> str:
    """When the session started: its `start_timestamp`, else its first event's time, else now (noted)."""
    start = doc.get("start_timestamp")
    if start is not None:
        return str(start) if not isinstance(start, str) else start
    times = [
        at
        for record in [*_list(doc.get("tool_calls")), *_list(doc.get("llm_calls"))]
        if isinstance(record, dict)
        for at in [instant(first_given(record, TIME_NAMES))]
        if at is not None
    ]
    chosen = min(times).isoformat() if times else datetime.now(UTC).isoformat()
    said = "its first event's time" if times else "the import's time"
    notes.append(("start_timestamp", f"missing: the session starts at {said}, {chosen}", MISSING_TIME))
    return chosen


def _seed_end(doc: Doc, calls: list[Any], start: str, notes: list[Note]) -> str:
    """When the session ended: its `end_timestamp`, else its last call's end (noted for a finished one)."""
    end = doc.get("end_timestamp")
    if end is not None:
        return str(end)
    ends = [at for c in calls if isinstance(c, dict) for at in [instant(c.get("finished_at"))] if at]
    chosen = max(ends).isoformat() if ends else start
    if doc.get("final_output") is not None:
        notes.append(
            ("end_timestamp", f"missing: the session ends at its last call's end, {chosen}", MISSING_TIME)
        )
    return chosen


def _seed_references(doc: Doc, notes: list[Note]) -> None:
    """Note each sub-goal naming an LLM call the file lacks, and each tool call naming a sub-goal the
    plan lacks; both are kept as the file has them."""
    plan = doc.get("agent_plan")
    goals = _list(plan.get("sub_goals")) if isinstance(plan, dict) else []
    llm_ids = {c.get("call_id") for c in _list(doc.get("llm_calls")) if isinstance(c, dict)}
    for j, goal in enumerate(goals):
        named = goal.get("llm_call_id") if isinstance(goal, dict) else None
        if named is not None and named not in llm_ids:
            notes.append(
                (
                    f"agent_plan.sub_goals.{j}.llm_call_id",
                    f"names LLM call {named!r}, which the file lacks",
                    DANGLING,
                )
            )
    goal_ids = {g.get("id") for g in goals if isinstance(g, dict)}
    for i, call in enumerate(_list(doc.get("tool_calls"))):
        named = first_given(call, ("sub_goal_id", "subgoal_id")) if isinstance(call, dict) else None
        if named is not None and named not in goal_ids:
            notes.append(
                (f"tool_calls.{i}.sub_goal_id", f"names sub-goal {named!r}, which the plan lacks", DANGLING)
            )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _sub_goal_calls(plan: Any) -> Doc:
    """The LLM call each sub-goal came from (the seed names one), kept in the metadata."""
    goals = plan.get("sub_goals", []) if isinstance(plan, dict) else []
    links = {g["id"]: g["llm_call_id"] for g in goals if isinstance(g, dict) and "llm_call_id" in g}
    return {"sub_goal_llm_calls": links} if links else {}


def _seed_plan(plan: Any) -> Any:
    if not isinstance(plan, dict):
        return plan
    goals = [
        {k: v for k, v in g.items() if k != "llm_call_id"} if isinstance(g, dict) else g
        for g in _list(plan.get("sub_goals"))
    ]
    return {"root_goal": plan.get("root_goal"), "subgoals": goals}


def _seed_tool_call(call: Any, where: str, start: str, notes: list[Note]) -> Any:
    """A seed tool call in sessionrl's names and times; its status is the file's, or (when it says none,
    or success) what the shared rule reads in its output (`tool_output_result`)."""
    if not isinstance(call, dict):
        return call
    ours = {theirs: mine for mine, theirs in SEED_CALL_FIELDS.items()} | {"subgoal_id": "subgoal_id"}
    renamed = {ours.get(k, k): v for k, v in call.items() if k not in TIME_NAMES}
    if call.get("status", "success") == "success" and "output" in call:
        result = tool_output_result(call["output"])
        if result.status is CallStatus.ERROR:
            renamed |= {"status": "error", "output": None, "error_code": result.error_code}
            renamed |= {"error_message": result.error_message}
    return {**renamed, **timing(call, where, start, notes), "recorded": True, "free_form": True}


def _seed_llm_call(call: Any, where: str, start: str, notes: list[Note]) -> Any:
    if not isinstance(call, dict):
        return call
    out = {k: v for k, v in call.items() if k != "prompt" and k not in TIME_NAMES}
    if "prompt" in call:
        out["messages"] = [{"role": "user", "content": call["prompt"]}]
    return {**out, **timing(call, where, start, notes), "recorded": True}


def _seed_feedback(sid: str, i: int, item: Any, where: str, ended: str, notes: list[Note]) -> Any:
    """A rating or comment, from any number of raters; one without a time is placed at the session's
    end (noted)."""
    if not isinstance(item, dict):
        return item
    at = item.get("timestamp")
    if at is None:
        notes.append((where, f"no time given: placed at the session's end, {ended}", MISSING_TIME))
        at = ended
    out = {("annotator" if k == "annotator_id" else k): v for k, v in item.items() if k != "timestamp"}
    return {"feedback_id": f"f_{sid}_{i}", **out, "occurred_at": at, "received_at": at}


def _seed_field(where: str, feedback_key: str) -> str:
    """A current document's field path in the seed's own names."""
    parts = where.split(".")
    if parts[0] == "tool_calls" and len(parts) > 2:
        parts[2] = SEED_CALL_FIELDS.get(parts[2], parts[2])
    if parts[0] == "feedback":
        parts[0] = feedback_key
        if len(parts) > 2:
            parts[2] = SEED_FEEDBACK_FIELDS.get(parts[2], parts[2])
    text = ".".join(parts)
    for ours, theirs in SEED_FIELDS.items():
        if text == ours or text.startswith(ours + "."):
            return theirs + text[len(ours) :]
    return text


# OpenAI chat transcripts

MESSAGE_TIMES = ("timestamp", "created_at", "created")


def from_openai(doc: Doc, notes: list[Note]) -> Doc:
    """An OpenAI chat transcript as a current session document (one LLM call per assistant message, one
    tool call per `tool` message, its status by the gateway's rule), with its reward and feedback. A
    message's own time (`timestamp`, `created_at` or `created`) dates its call, and the time since the
    message before gives the latency; a transcript with no time at all takes the import's (noted)."""
    messages = doc.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRecord([("messages", "expected a list of message objects")])
    problems: list[tuple[str, str]] = []
    sid = str(doc.get("session_id") or derived_id("oai", messages))
    at = _transcript_time(doc, messages, notes)
    user = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), None)
    if user is None:
        problems.append(("messages", "no user message: the session's query is the first one"))
    model = str(doc.get("model") or "") or None
    llm_calls, tool_calls = _openai_calls(sid, messages, model, at, problems, notes)
    last = messages[-1] if messages else {}
    final = (
        _text(last.get("content")) if last.get("role") == "assistant" and not last.get("tool_calls") else None
    )
    ended = first_given(last, MESSAGE_TIMES) if isinstance(last, dict) else None
    native: Doc = {
        "schema_version": SCHEMA_VERSION,
        "session_id": sid,
        "trace_id": _trace_id(sid),
        "state": "finished",
        "user_query": user or "",
        "tags": doc.get("tags", []),
        "metadata": {"imported_from": "openai", **({"model": doc["model"]} if doc.get("model") else {})},
        "tool_calls": tool_calls,
        "llm_calls": llm_calls,
        "feedback": _openai_feedback(sid, doc, _iso(ended) or at, problems),
        "final_output": {"text": final} if final else None,
        "created_at": at,
        "updated_at": _iso(ended) or at,
    }
    if problems:
        raise BadRecord(problems)
    _validate(native, lambda where: where)
    return native


def _iso(value: Any) -> str | None:
    """A message time as RFC 3339 text (None for none that reads)."""
    at = instant(value)
    return None if at is None else at.isoformat()


def _transcript_time(doc: Doc, messages: list[Doc], notes: list[Note]) -> str:
    """When the transcript began: its `created_at`, else its first message's time, else now (noted)."""
    given = doc.get("created_at")
    if given is not None:
        return _iso(given) or str(given)
    first = next((t for m in messages for t in [_iso(first_given(m, MESSAGE_TIMES))] if t is not None), None)
    if first is not None:
        return first
    now = datetime.now(UTC).isoformat()
    notes.append(
        ("created_at", f"missing, and no message has a time: every call is placed at {now}", MISSING_TIME)
    )
    return now


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _message(m: Doc) -> Doc:
    calls = [
        {
            "id": c.get("id"),
            "name": c.get("function", {}).get("name"),
            "arguments": c.get("function", {}).get("arguments") or "{}",
        }
        for c in m.get("tool_calls") or ()
        if isinstance(c, dict)
    ]
    role = "system" if m.get("role") == "developer" else m.get("role")
    out: Doc = {"role": role, "content": _text(m.get("content")), "tool_calls": calls}
    return {**out, "tool_call_id": m["tool_call_id"]} if m.get("tool_call_id") else out


def _openai_calls(
    sid: str,
    messages: list[Doc],
    model: str | None,
    at: str,
    problems: list[tuple[str, str]],
    notes: list[Note],
) -> tuple[list[Doc], list[Doc]]:
    """One LLM call per assistant message and one tool call per `tool` message, dated by their messages
    (the transcript's time when a message has none); a tool call never answered is noted."""
    llm_calls: list[Doc] = []
    tool_calls: list[Doc] = []
    asked: dict[str, tuple[Doc, str]] = {}
    answered: set[str] = set()
    times = [_iso(first_given(m, MESSAGE_TIMES)) for m in messages]
    for i, m in enumerate(messages):
        when = times[i] or at
        if m.get("role") == "assistant":
            message = _message(m)
            asked.update((c["id"], (c, when)) for c in message["tool_calls"])
            since = times[i - 1] if i > 0 and times[i] else None
            llm_calls.append(
                {"call_id": f"{sid}.l{i}", "purpose": "chat", "messages": [_message(x) for x in messages[:i]],
                 "response": message["content"], "tool_calls": message["tool_calls"], "model": model,
                 **_span(since or when, when), "recorded": True}
            )  # fmt: skip
        elif m.get("role") == "tool":
            found = asked.get(str(m.get("tool_call_id")))
            if found is None:
                problems.append((f"messages.{i}.tool_call_id", "no earlier assistant tool call has this id"))
                continue
            call, asked_at = found
            answered.add(call["id"])
            result = tool_message_result(_text(m.get("content")))
            tool_calls.append(
                {"call_id": call["id"], "tool": call["name"], "params": _arguments(call["arguments"]),
                 **result.model_dump(exclude={"latency_ms"}), **_span(asked_at, when),
                 "recorded": True, "free_form": True}
            )  # fmt: skip
    for call_id in asked.keys() - answered:
        notes.append(("messages", f"tool call {call_id!r} is never answered by a tool message", UNANSWERED))
    return llm_calls, tool_calls


def _span(start: str, end: str) -> Doc:
    """A call's times and the latency between them (0 when either does not read)."""
    began, ended = instant(start), instant(end)
    latency = max((ended - began).total_seconds() * 1000, 0.0) if began and ended else 0.0
    return {"started_at": start, "finished_at": end, "latency_ms": latency}


def _arguments(text: str) -> Doc:
    value = _json_or_text(text)
    return value if isinstance(value, dict) else {"arguments": value}


def _json_or_text(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _openai_feedback(sid: str, doc: Doc, at: str, problems: list[tuple[str, str]]) -> list[Doc]:
    """`reward` (a number) as a task outcome; `feedback` (text, an object, or a list of them) as comments
    and 1-5 ratings."""
    out: list[Doc] = []
    reward = doc.get("reward")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            problems.append(("reward", "expected a number"))
        else:
            out.append({"type": "task_outcome", "score": reward, "annotator": "import"})
    items = doc.get("feedback")
    for i, item in enumerate(items if isinstance(items, list) else [] if items is None else [items]):
        where = f"feedback.{i}" if isinstance(items, list) else "feedback"
        if isinstance(item, str):
            out.append({"type": "comment", "comment": item})
        elif isinstance(item, dict):
            out += _feedback_items(item, where, problems)
        else:
            problems.append((where, "expected text or an object with rating and comment"))
    return [
        {"feedback_id": f"f_{sid}_{i}", "occurred_at": at, "received_at": at, **f} for i, f in enumerate(out)
    ]


def _feedback_items(item: Doc, where: str, problems: list[tuple[str, str]]) -> list[Doc]:
    rating, comment = item.get("rating", item.get("score")), item.get("comment")
    if rating is None:
        return [{"type": "comment", "comment": comment, "annotator": item.get("annotator")}]
    if isinstance(rating, bool) or not isinstance(rating, int | float) or not 1 <= rating <= 5:
        problems.append((f"{where}.rating", f"a rating is a number from 1 to 5, got {rating!r}"))
        return []
    return [{"type": "human_rating", "score": rating, "comment": comment, "annotator": item.get("annotator")}]


def _validate(native: Doc, rename: Callable[[str], str]) -> None:
    """Check `native` as a session document; `BadRecord` names each problem in the file's own terms."""
    try:
        Session.model_validate(native)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "record"
            problems.append((rename(where), f"{e['msg']} ({e['type']})"))
        raise BadRecord(problems) from exc
